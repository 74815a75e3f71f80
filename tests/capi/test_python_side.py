"""uaii-capi's Python side and its build: header parsing, exported symbols, defaults, paths, the adapter's pieces,
and libuaii loaded into this (already running) interpreter."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from uaii.capi import GenerateConfig, SessionConfig, Status, status_name
from uaii.capi import paths as capi_paths
from uaii.capi.adapter import _as_input
from uaii.capi.convert import rebase
from uaii.capi.irmodel import fill, is_ir_path
from uaii.capi.profiler import Profiler
from uaii.capi.status import STATUS_NAMES, CapiError, error_message, status_of
from uaii.ir import DType, Tensor, WeightRef, WeightRefError, make_graph

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "uaii-capi"


@pytest.fixture(scope="module")
def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uaii_build_capi", PACKAGE / "build_capi.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def abi(build_script: ModuleType) -> tuple[Any, Any]:
    """(ffi, lib): libuaii opened in ABI mode with declarations generated from the header."""
    from cffi import FFI

    types, py_funcs, c_funcs = build_script.split_api()
    ffi = FFI()
    ffi.cdef("\n".join(types + py_funcs + c_funcs))
    return ffi, ffi.dlopen(capi_paths.library_path())


def test_header_statuses_match_python() -> None:
    header = Path(capi_paths.header_path()).read_text()
    found = {m.group(1): int(m.group(2)) for m in re.finditer(r"\bUAII_(OK|ERR_\w+) = (\d+)", header)}
    assert found == {s.name: s.value for s in Status}


def test_status_names_match_the_library(abi: tuple[Any, Any]) -> None:
    ffi, lib = abi
    for value in [*range(12), 1000]:
        assert ffi.string(lib.uaii_status_name(value)).decode() == status_name(value)
    assert set(STATUS_NAMES.values()) == {"ok", "invalid_argument", "not_found", "io", "config", "plugin", "abi",
                                          "not_implemented", "internal"}


def test_every_declared_function_is_exported_and_implemented(build_script: ModuleType,
                                                             abi: tuple[Any, Any]) -> None:
    from uaii.capi import _exports

    _, lib = abi
    types, py_funcs, c_funcs = build_script.split_api()
    names = [build_script.function_name(d) for d in py_funcs + c_funcs]
    for name in names:
        assert getattr(lib, name) is not None  # AttributeError when the symbol is missing
    implemented = {fn.__name__ for fn, _ in _exports._EXPORTS}
    assert implemented == {build_script.function_name(d) for d in py_funcs}
    assert set(build_script.C_FUNCTIONS) == {build_script.function_name(d) for d in c_funcs}
    assert any("uaii_session_options" in t for t in types)
    symbols = subprocess.run(["nm", "-D", "--defined-only", capi_paths.library_path()], capture_output=True,
                             text=True).stdout
    exported = set(re.findall(r" T (\w+)$", symbols, re.M))
    assert exported == set(names) | {"PyInit__uaii_capi_cffi"}  # nothing internal leaks out


def test_generated_wrapper_starts_python_first(build_script: ModuleType) -> None:
    stub, wrapper = build_script.python_backed("void uaii_session_destroy(uaii_session* session);")
    assert stub == "void uaii__py_session_destroy(uaii_session* session);"
    assert "uaii__start_python(\"uaii_session_destroy\") != 0) return;" in wrapper
    stub, wrapper = build_script.python_backed(
        "uaii_status uaii_session_run(uaii_session* session);")
    assert "return UAII_ERR_INTERNAL;" in wrapper and "return uaii__py_session_run(session);" in wrapper


def test_option_defaults_match_the_c_initializer(abi: tuple[Any, Any]) -> None:
    ffi, lib = abi
    o = ffi.new("uaii_session_options *")
    lib.uaii_session_options_init_sized(o, ffi.sizeof("uaii_session_options"))
    for name, default in vars(SessionConfig()).items():
        value = getattr(o, name)
        if isinstance(value, ffi.CData):  # a const char*
            value = None if value == ffi.NULL else ffi.string(value).decode()
        assert value == default, name
    g = ffi.new("uaii_generate_params *")
    lib.uaii_generate_params_init_sized(g, ffi.sizeof("uaii_generate_params"))
    for name, default in vars(GenerateConfig()).items():
        if name in ("stop_token_ids", "stop_strings"):
            continue
        assert getattr(g, name) == pytest.approx(default), name


_IN_PROCESS = """
import gc, json, sys
from cffi import FFI
from uaii.capi import _exports
ffi = FFI()
ffi.cdef("typedef struct uaii_session uaii_session; const char* uaii_last_error(void);"
         "int uaii_session_create(const char*, void*, uaii_session**); void uaii_session_destroy(uaii_session*);"
         "int uaii_session_set_f32(uaii_session*, const char*, const float*, size_t);"
         "int uaii_session_get_f32(uaii_session*, const char*, float*, size_t, size_t*);"
         "int uaii_session_run(uaii_session*);")
lib = ffi.dlopen(sys.argv[1])
out = ffi.new("uaii_session **")
assert lib.uaii_session_create(sys.argv[2].encode(), ffi.NULL, out) == 0, ffi.string(lib.uaii_last_error())
before = len(_exports._sessions)
x = ffi.new("float[4]", [-1.0, 2.0, -3.0, 4.0])
assert lib.uaii_session_set_f32(out[0], b"x", x, 4) == 0
assert lib.uaii_session_run(out[0]) == 0
y, n = ffi.new("float[4]"), ffi.new("size_t *")
assert lib.uaii_session_get_f32(out[0], b"y", y, 4, n) == 0
assert list(y) == [0.0, 2.0, 0.0, 4.0] and n[0] == 4
lib.uaii_session_destroy(out[0])
assert len(_exports._sessions) == before - 1
assert lib.uaii_session_run(out[0]) == 1 and b"not a live" in ffi.string(lib.uaii_last_error())
# the interpreter is intact afterwards: walk every module and object
assert len(set(sys.modules.values())) > 10 and gc.collect() >= 0
print("ok")
"""


def test_library_in_a_running_interpreter(tmp_path: Path) -> None:
    """Loaded into a process that already runs Python, libuaii uses that interpreter; handles are released. Runs in
    a fresh interpreter of its own so that a fault cannot take the test process down with it."""
    path = tmp_path / "relu.uaii.json"
    path.write_text(json.dumps(_relu_graph()))
    proc = subprocess.run([sys.executable, "-c", _IN_PROCESS, capi_paths.library_path(), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _relu_graph() -> dict[str, Any]:
    tensor = {"dtype": "f32", "shape": [1, 4], "storage_hint": "ram", "is_weight": False, "weight_ref": ""}
    return {"ir_version": {"major": 1, "minor": 0}, "name": "relu", "producer": "test", "domain": "uaii",
            "tensors": [{"id": 1, "name": "x", **tensor}, {"id": 2, "name": "y", **tensor}],
            "nodes": [{"id": 1, "name": "r", "op_name": "Relu", "op_version": "1", "inputs": [1], "outputs": [2],
                       "attributes": []}],
            "inputs": [1], "outputs": [2], "metadata": {}}


def test_cli_prints_build_flags() -> None:
    run = subprocess.run([sys.executable, "-m", "uaii.capi", "--cflags", "--libs"], capture_output=True, text=True,
                         check=True)
    flags = run.stdout.split()
    assert f"-I{capi_paths.get_include()}" in flags and "-luaii" in flags
    assert f"-Wl,-rpath,{capi_paths.get_library_dir()}" in flags
    assert any(f.startswith("-lpython3") for f in flags)
    assert Path(capi_paths.get_include(), "uaii", "c_api", "uaii.h").is_file()
    assert Path(capi_paths.get_include(), "uaii", "c_api", "version.h").is_file()
    version = subprocess.run([sys.executable, "-m", "uaii.capi", "--c-api-version"], capture_output=True,
                             text=True, check=True)
    assert version.stdout.strip() == "0.3.0" == capi_paths.C_API_VERSION
    assert subprocess.run([sys.executable, "-m", "uaii.capi"], capture_output=True).returncode == 2


def test_exception_statuses() -> None:
    assert status_of(FileNotFoundError("x")) == Status.ERR_NOT_FOUND
    assert status_of(PermissionError("x")) == Status.ERR_IO
    assert status_of(NotImplementedError()) == Status.ERR_NOT_IMPLEMENTED
    assert status_of(WeightRefError("escapes")) == Status.ERR_INVALID_ARGUMENT
    assert status_of(CapiError(Status.ERR_ABI, "x")) == Status.ERR_ABI
    assert status_of(RuntimeError("bug")) == Status.ERR_INTERNAL
    from uaii.runtime.presets import PresetError

    assert status_of(PresetError("nope")) == Status.ERR_CONFIG
    assert error_message("uaii_x", CapiError(Status.ERR_IO, "disk full")) == "[capi] uaii_x: disk full"
    assert error_message("uaii_x", KeyError("k")) == "[capi] uaii_x: KeyError: 'k'"


def test_option_validation() -> None:
    with pytest.raises(CapiError, match="weight_init"):
        SessionConfig(weight_init=9)
    with pytest.raises(CapiError, match="pin_layers"):
        SessionConfig(pin_layers=-2)
    with pytest.raises(CapiError, match="top_p"):
        GenerateConfig(top_p=1.5)
    with pytest.raises(CapiError, match="stop_strings"):
        GenerateConfig(stop_strings=("",))


def test_fill_patterns() -> None:
    t = Tensor("w", DType.F32, (2, 3), is_weight=True)
    assert fill(t, 1).sum() == 0 and fill(t, 2).sum() == 6
    np.testing.assert_allclose(fill(t, 3).ravel(), np.arange(6) * 0.01, rtol=1e-6)
    with pytest.raises(CapiError, match="not concrete"):
        fill(Tensor("w", DType.F32, ("n", 3), is_weight=True), 2)
    assert is_ir_path("a.uaii") and is_ir_path("a.UAII.JSON") and is_ir_path("a.json") and not is_ir_path("a.gguf")


def test_inputs_take_their_declared_shape_and_type() -> None:
    t = Tensor("tokens", DType.I64, ("seq",))
    got = _as_input(t, np.array([1, 2, 3], np.float32))
    assert got.dtype == np.int64 and got.shape == (3,)
    assert _as_input(Tensor("x", DType.F32, ("n", 2)), np.zeros(6, np.float32)).shape == (3, 2)
    with pytest.raises(CapiError, match="does not fit"):
        _as_input(Tensor("x", DType.F32, ("n", 4)), np.zeros(6, np.float32))
    with pytest.raises(CapiError, match="2 symbolic"):
        _as_input(Tensor("x", DType.F32, ("a", "b")), np.zeros(6, np.float32))


def test_convert_rebases_references(tmp_path: Path) -> None:
    graph = make_graph("g", nodes=[], inputs=[], outputs=[],
                       tensors=[Tensor("w", DType.F32, (2,), weight=WeightRef("weights/w.bin"))])
    moved = rebase(graph, tmp_path / "model", tmp_path / "out")
    assert moved.tensor_map["w"].weight == WeightRef("../model/weights/w.bin")
    assert rebase(graph, tmp_path, tmp_path) is graph


def test_profiler_summary_and_trace(tmp_path: Path) -> None:
    p = Profiler(enabled=True)
    with p.span("run", inputs=1):
        pass
    with p.span("run"):
        pass
    assert "run" in p.summary() and " 2 " in p.summary()
    p.write_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["ph"] for e in events] == ["X", "X"] and events[0]["args"] == {"inputs": 1}
    off = Profiler(enabled=False)
    with off.span("run"):
        pass
    assert off.spans == []


_CAPSULE_THEN_CREATE = """
import datetime, sys
from cffi import FFI
getattr(datetime.datetime_CAPI, "anything", None)  # the type attribute cache tags PyCapsule_Type
ffi = FFI()
ffi.cdef("typedef struct uaii_session uaii_session; int uaii_session_create(const char*, void*, uaii_session**);"
         "const char* uaii_last_error(void);")
lib = ffi.dlopen(sys.argv[1])
out = ffi.new("uaii_session **")
print(lib.uaii_session_create(b"/nonexistent/model.uaii", ffi.NULL, out), ffi.string(lib.uaii_last_error()).decode())
"""


def test_start_inside_a_python_that_tagged_the_capsule_type() -> None:
    """Regression: cffi's start-up lock is PyCapsule_Type.tp_version_tag (Python < 3.12); once any attribute lookup on
    a capsule had tagged the type (numpy and torch do it), loading libuaii into that interpreter spun forever."""
    proc = subprocess.run([sys.executable, "-c", _CAPSULE_THEN_CREATE, capi_paths.library_path()],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{Status.ERR_NOT_FOUND.value} ") and "no such file" in proc.stdout
