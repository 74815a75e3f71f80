"""Kernels compiled at first use by NVRTC (the ``nvidia-cuda-nvrtc`` wheel through ``cuda-bindings``), for the
device's architecture, and kept on disk.

No nvcc, no system toolkit: NVRTC compiles without a driver, so CI compiles every module for sm_80 and sm_90 on
machines without a GPU (tests/backends/test_cuda_kernels.py). The cache key is the module's source digest (source,
headers, options), the architecture and the NVRTC version; an entry is written to a temporary file in the cache
directory and renamed into place, so a crash or a concurrent compile never leaves a partial CUBIN under a key.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uaii.backends.base import BackendError
from uaii.backends.cuda.sources import MODULES, Module, digest, headers, source

EXTRA = "pip install 'uaii-backends[cuda]'"
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
"""Architectures the kernels are written for (Ampere and later: warp shuffles, 48+ KiB shared memory)."""
BASE_OPTIONS = ("-std=c++17", "-default-device")  # no --use_fast_math: accurate expf, sincosf, division


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise BackendError(f"[cuda] NVRTC is not installed ({exc.name or exc}): {EXTRA}") from None
    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return int(major), int(minor)


def cache_dir() -> Path:
    """Where compiled modules are kept: $UAII_CACHE_DIR/cuda, else ~/.cache/uaii/cuda."""
    root = os.environ.get("UAII_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "uaii")
    return Path(root) / "cuda"


def cache_key(module: Module, arch: str, version: tuple[int, int]) -> str:
    return f"{module.name}-{arch}-nvrtc{version[0]}.{version[1]}-{digest(module)[:24]}"


@dataclass(frozen=True)
class Compiled:
    """A module's CUBIN for one architecture, and whether it came from the disk cache."""

    module: Module
    arch: str
    cubin: bytes
    cached: bool


def compile_module(name: str, arch: str, *, use_cache: bool = True) -> Compiled:
    """The CUBIN of kernel module ``name`` (see :data:`uaii.backends.cuda.sources.MODULES`) for ``arch``."""
    if name not in MODULES:
        raise BackendError(f"[cuda] no kernel module {name!r}; modules: {', '.join(MODULES)}")
    if arch not in ARCHS:
        raise BackendError(f"[cuda] architecture {arch!r} is not one the kernels are built for ({', '.join(ARCHS)})")
    module = MODULES[name]
    path = cache_dir() / f"{cache_key(module, arch, nvrtc_version())}.cubin"
    if use_cache and path.is_file():
        return Compiled(module, arch, path.read_bytes(), True)
    cubin = _compile(module, arch)[0]
    if use_cache:
        write_atomic(path, cubin)
    return Compiled(module, arch, cubin, False)


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a temporary file in the same directory, renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Resources:
    """What ptxas reports of one kernel: registers per thread, static shared memory, stack frame and spilled bytes
    (stores + loads to local memory). Registers bound how many blocks an SM holds (65536 a SM), spills cost every
    thread memory traffic: the tests hold both to limits (tests/backends/test_cuda_kernels.py)."""

    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_bytes: int


_RESOURCES = re.compile(r"Function properties for (\w+)\n[^\n]*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                        r"(\d+) bytes spill loads\n[^\n]*?Used (\d+) registers(?:, used \d+ barriers)?"
                        r"(?:, (\d+) bytes smem)?")


def resources(name: str, arch: str) -> dict[str, Resources]:
    """Each kernel of module ``name`` compiled for ``arch``, as ptxas reports it (a verbose compile, not cached)."""
    module = MODULES[name]
    log = _compile(module, arch, verbose=True)[1]
    out = {m.group(1): Resources(int(m.group(5)), int(m.group(6) or 0), int(m.group(2)),
                                 int(m.group(3)) + int(m.group(4)))
           for m in _RESOURCES.finditer(log)}
    if set(out) != set(module.kernels):
        raise BackendError(f"[cuda] ptxas reported {sorted(out)} for {module.filename}, which defines "
                           f"{sorted(module.kernels)}:\n{log}")
    return out


@dataclass(frozen=True)
class UnitCost:
    """What one thread of a kernel executes between its first two barriers, counted in its SASS: for the GEMVs the
    work of one 32-value unit per lane once the step is staged (decode, products, sums — straight-line code), so
    ``shared_loads`` is what the unit costs the SM's shared-memory pipe (a cycle an instruction, whatever its width)
    and ``instructions`` what it costs the schedulers. A static count, not a timing: the cost model where there is
    no GPU to time on."""

    instructions: int
    shared_loads: int


def nvdisasm() -> str:
    """The path of NVIDIA's disassembler: the nvidia-cuda-nvdisasm wheel's (the ``cuda-tools`` development group),
    else one on PATH; BackendError when there is none (it is a development tool, no user needs it)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for found in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(found)
    found_on_path = shutil.which("nvdisasm")
    if found_on_path is None:
        raise BackendError("[cuda] no nvdisasm: pip install nvidia-cuda-nvdisasm (the cuda-tools group)")
    return found_on_path


_SASS_FUNCTION = re.compile(r"//-+ \.text\.(\w+)\s+-+")
_SASS_OP = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")


def unit_costs(name: str, arch: str) -> dict[str, UnitCost]:
    """:class:`UnitCost` of each kernel of module ``name`` with at least two barriers, compiled for ``arch``."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / f"{name}.cubin"
        cubin.write_bytes(_compile(MODULES[name], arch)[0])
        text = subprocess.run([nvdisasm(), "-c", str(cubin)], check=True, capture_output=True, text=True).stdout
    parts = _SASS_FUNCTION.split(text)
    out = {}
    for kernel, body in zip(parts[1::2], parts[2::2], strict=True):
        ops = [m.group(1) for m in _SASS_OP.finditer(body)]
        bars = [i for i, op in enumerate(ops) if op == "BAR"]
        if len(bars) >= 2:
            stretch = ops[bars[0] + 1:bars[1]]
            out[kernel] = UnitCost(len(stretch), sum(op == "LDS" for op in stretch))
    return out


def _compile(module: Module, arch: str, verbose: bool = False) -> tuple[bytes, str]:
    """The CUBIN, and with ``verbose`` ptxas' report of every kernel (the program log)."""
    nvrtc = _nvrtc()
    hdrs = headers()
    err, prog = nvrtc.nvrtcCreateProgram(source(module.filename).encode(), module.filename.encode(), len(hdrs),
                                         [t.encode() for t in hdrs.values()], [n.encode() for n in hdrs])
    _check(nvrtc, err, f"nvrtcCreateProgram({module.filename})")
    try:
        opts = [o.encode() for o in (*BASE_OPTIONS, f"--gpu-architecture={arch}", *module.options,
                                     *(["--ptxas-options=-v"] if verbose else []))]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise BackendError(f"[cuda] {module.filename} does not compile for {arch}:\n{_log(nvrtc, prog)}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        _check(nvrtc, err, "nvrtcGetCUBIN")
        return bytes(buf), _log(nvrtc, prog) if verbose else ""
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(nvrtc: Any, prog: Any) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return "(no log)"
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0 ").decode("utf-8", "replace")


def _check(nvrtc: Any, err: Any, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendError(f"[cuda] {what} failed: {err}")


__all__ = ["ARCHS", "BASE_OPTIONS", "EXTRA", "Compiled", "Resources", "UnitCost", "cache_dir", "cache_key",
           "compile_module", "nvdisasm", "nvrtc_version", "resources", "unit_costs", "write_atomic"]
