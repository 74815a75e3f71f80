"""cffi build script (embedding mode) of ``libuaii``, the shared library behind the UAII C API.

Run by setuptools through ``cffi_modules`` in setup.py (setup.py names the output ``uaii/capi/libuaii.so``).
The public header ``src/uaii/capi/include/uaii/c_api/uaii.h`` is the single source of truth: the block between its
UAII_CDEF markers, comments and the UAII_API marker removed, becomes the cffi declarations. Its functions split in
two by where they are implemented:

* ``C_FUNCTIONS`` are written in csrc/uaii_capi.c (versions, status names, last error, option initializers) and
  work without starting Python; they are declared with ``ffibuilder.cdef`` so the Python side can call them too;
* every other function is implemented in Python (uaii/capi/_exports.py). Its declaration, renamed
  ``uaii_X`` -> ``uaii__py_X``, goes to ``ffibuilder.embedding_api``: cffi generates that C stub, which calls the
  ``@ffi.def_extern`` of the same name. The public ``uaii_X`` is a wrapper generated here from the same
  declaration: it first makes sure the embedded interpreter started (csrc/uaii_capi_embed.h) and returns
  UAII_ERR_INTERNAL with a last error when it could not, where cffi alone would return 0 (UAII_OK).

A name listed here but not defined in C fails the link (``--no-undefined``); one defined in C but not listed is a
duplicate definition, so the two cannot drift apart silently. Only ``uaii_*`` and the module init are exported
(csrc/libuaii.map). Portable flags only (no -march=native).
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import tomllib

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
INCLUDE = os.path.join(HERE, "src", "uaii", "capi", "include")
HEADER = os.path.join(INCLUDE, "uaii", "c_api", "uaii.h")
CSRC = os.path.join(HERE, "csrc")
INTERNAL_HEADER = os.path.join(CSRC, "uaii_capi_internal.h")
MODULE = "uaii.capi._uaii_capi_cffi"  # the embedded module; setup.py writes it as uaii/capi/libuaii.so

C_FUNCTIONS = frozenset({
    "uaii_session_options_init", "uaii_session_options_init_sized", "uaii_generate_params_init_sized",
    "uaii_get_version", "uaii_get_version_string", "uaii_get_c_api_version", "uaii_get_c_api_version_string",
    "uaii_status_name", "uaii_last_error", "uaii_abi_version", "uaii_check_version",
})


def marked_block(path: str, begin: str, end: str) -> str:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    m = re.search(re.escape(begin) + r"(.*?)" + re.escape(end), text, re.S)
    if m is None:
        raise RuntimeError(f"{path}: markers {begin} / {end} not found")
    return m.group(1)


def strip_c(text: str) -> str:
    """Comments and the UAII_API marker removed; a preprocessor line inside the block is an error."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            raise RuntimeError(f"{HEADER}: preprocessor line inside the CDEF block: {line.strip()!r}")
    return re.sub(r"\bUAII_API\b", "", text)


def declarations(text: str) -> list[str]:
    """Top-level declarations (split at ';' outside braces and parentheses), whitespace normalized."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        elif ch == ";" and depth == 0:
            out.append(" ".join(text[start:i].split()) + ";")
            start = i + 1
    if text[start:].strip():
        raise RuntimeError(f"{HEADER}: trailing text after the last declaration: {text[start:].strip()[:60]!r}")
    return out


def function_name(decl: str) -> str | None:
    """The declared function's name, or None for a type or typedef."""
    if decl.startswith("typedef ") or decl.startswith("struct ") or decl.startswith("enum "):
        return None
    m = re.search(r"(\w+)\s*\(", decl)
    return m.group(1) if m else None


def split_api() -> tuple[list[str], list[str], list[str]]:
    """(types, functions implemented in Python, functions implemented in C) of the public header."""
    types: list[str] = []
    py_funcs: list[str] = []
    c_funcs: list[str] = []
    for decl in declarations(strip_c(marked_block(HEADER, "/* UAII_CDEF_BEGIN */", "/* UAII_CDEF_END */"))):
        name = function_name(decl)
        if name is None:
            types.append(decl)
        else:
            (c_funcs if name in C_FUNCTIONS else py_funcs).append(decl)
    missing = C_FUNCTIONS - {function_name(d) for d in c_funcs}
    if missing:
        raise RuntimeError(f"{HEADER}: C_FUNCTIONS not declared in the header: {sorted(missing)}")
    return types, py_funcs, c_funcs


def package_version() -> tuple[str, list[str]]:
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as fh:
        version = tomllib.load(fh)["project"]["version"]
    parts = [*re.findall(r"\d+", version), "0", "0", "0"][:3]
    return version, parts


def python_name(name: str) -> str:
    """``uaii_session_create`` -> ``uaii__py_session_create``: the cffi stub behind a Python-backed function."""
    return "uaii__py_" + name.removeprefix("uaii_")


_DECL = re.compile(r"^(?P<ret>.+?)\s*\b(?P<name>uaii_\w+)\s*\((?P<params>.*)\);$")


def parameter_names(params: str) -> list[str]:
    if params.strip() in ("", "void"):
        return []
    names = []
    for param in params.split(","):  # no function-pointer parameters among the Python-backed functions
        m = re.search(r"(\w+)\s*$", param)
        if m is None or "(" in param:
            raise RuntimeError(f"{HEADER}: cannot name the parameter {param.strip()!r}")
        names.append(m.group(1))
    return names


def python_backed(decl: str) -> tuple[str, str]:
    """(the stub's declaration for embedding_api, the public wrapper's C definition) of one declaration."""
    m = _DECL.match(decl)
    if m is None:
        raise RuntimeError(f"{HEADER}: cannot parse the declaration {decl!r}")
    ret, name, params = m.group("ret"), m.group("name"), m.group("params")
    stub = f"{ret} {python_name(name)}({params});"
    names = parameter_names(params)
    args = ", ".join(names)
    # an output handle (`T** out`) is NULL on every failure, even when the interpreter cannot start
    reset = "if (out != NULL) *out = NULL;\n    " if re.search(r"\*\s*\*\s*out\b", params) else ""
    if ret == "void":
        body = f"if (uaii__start_python(\"{name}\") != 0) return;\n    {python_name(name)}({args});"
    else:
        body = (f"{reset}if (uaii__start_python(\"{name}\") != 0) return UAII_ERR_INTERNAL;\n"
                f"    return {python_name(name)}({args});")
    return stub, f"UAII_API {ret} {name}({params}) {{\n    {body}\n}}\n"


def init_code(py_funcs: list[str]) -> str:
    """Python run once inside the library when the first embedded function is called.

    It loads uaii/capi/_bootstrap.py from the library's own directory (the embedded interpreter does not know the
    virtual environment yet), which sets up sys.path and imports the ``def_extern`` implementations. If anything
    fails, every embedded function is replaced by one that returns UAII_ERR_INTERNAL (void ones do nothing) with
    the reason as last error: cffi alone would print a traceback and make every call return 0, i.e. UAII_OK.
    """
    fallbacks = {python_name(function_name(d) or ""): (None if d.startswith("void ") else 8) for d in py_funcs}
    return f"""
import sys
_mod = sys.modules[{MODULE!r}]
try:
    import importlib.util, os
    _dir = os.path.dirname(_mod.ffi.string(_mod.lib.uaii__library_path()).decode("utf-8", "surrogateescape"))
    _spec = importlib.util.spec_from_file_location("_uaii_capi_bootstrap", os.path.join(_dir, "_bootstrap.py"))
    _boot = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_boot)
    _boot.start(_mod.ffi, _mod.lib)
except BaseException as _exc:
    import traceback
    traceback.print_exc()
    _msg = ("[capi] the Python side of libuaii failed to start: " + repr(_exc)
            + " (see docs/c-api.md, 'Running': VIRTUAL_ENV or PYTHONPATH must reach the uaii packages)")
    def _failing(result):
        def fn(*args):
            _mod.lib.uaii__set_error(_msg.encode("utf-8", "replace"))
            return result
        return fn
    for _name, _result in {fallbacks!r}.items():
        _mod.ffi.def_extern(name=_name)(_failing(_result))
"""


def make_builder() -> FFI:
    types, py_funcs, c_funcs = split_api()
    stubs, wrappers = zip(*(python_backed(d) for d in py_funcs), strict=True)
    version, (major, minor, patch) = package_version()
    ffibuilder = FFI()
    ffibuilder.embedding_api("\n".join(types + list(stubs)))
    ffibuilder.cdef("\n".join(c_funcs) + "\n" + strip_c(marked_block(INTERNAL_HEADER, "/* CDEF BEGIN */",
                                                                      "/* CDEF END */")))
    ffibuilder.embedding_init_code(init_code(py_funcs))
    libdir = sysconfig.get_config_var("LIBDIR") or os.path.join(sys.base_prefix, "lib")
    preamble = "\n".join([
        '#include "uaii/c_api/uaii.h"', '#include "uaii_capi_internal.h"',
        "#undef uaii_session_options_init", "#undef uaii_generate_params_init",
        '#include "uaii_capi_embed.h"', "", "/* cffi stubs of the Python-backed functions (defined below) */",
        *(f"CFFI_DLLEXPORT {s}" for s in stubs), "", "/* the public entry points */", *wrappers,
    ])
    ffibuilder.set_source(
        MODULE,
        preamble,
        # Relative paths: setuptools rejects absolute source paths in an sdist build.
        sources=[os.path.relpath(os.path.join(CSRC, "uaii_capi.c"))],
        include_dirs=[os.path.relpath(INCLUDE), os.path.relpath(CSRC)],
        define_macros=[
            ("UAII_BUILDING_LIBRARY", "1"),
            ("UAII_LIBRARY_VERSION_MAJOR", major), ("UAII_LIBRARY_VERSION_MINOR", minor),
            ("UAII_LIBRARY_VERSION_PATCH", patch), ("UAII_LIBRARY_VERSION_STRING", f'"{version}"'),
        ],
        extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"],
        # An embedding library links libpython itself and finds it at run time through its RUNPATH.
        libraries=[f"python{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}", "dl"],
        library_dirs=[libdir],
        extra_link_args=["-pthread", "-Wl,--no-undefined", "-Wl,-soname,libuaii.so", f"-Wl,-rpath,{libdir}",
                         f"-Wl,--version-script={os.path.relpath(os.path.join(CSRC, 'libuaii.map'))}"],
        py_limited_api=False,
    )
    return ffibuilder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(target="libuaii.*", verbose=True)
