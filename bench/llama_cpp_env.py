"""llama.cpp's benchmark-only environment: llama-cpp-python built from its sdist into ``.venv-llama-cpp`` (never the
project's .venv, never a user's install), with a build that runs on this machine.

llama.cpp's default CPU build is ``-march=native``, which on some VMs picks instructions the CPU reports but the VM
does not enable (an Intel Xeon reporting AMX: its repack path dies with SIGILL). So the native build is tried first
and smoke-tested on the benchmark's model in a subprocess; when it dies of a signal, it is rebuilt with the ISA
flags /proc/cpuinfo lists set explicitly (AVX2, FMA, F16C, AVX-512 and its VNNI/VBMI/BF16, AVX-VNNI; never AMX). The
environment records which build it holds (``uaii-llama-cpp.json``) and is reused while the pins are unchanged.

    uv run --no-sync python bench/llama_cpp_env.py MODEL.gguf     # build (minutes, once) and print its interpreter
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-llama-cpp"
RECORD = VENV / "uaii-llama-cpp.json"
WORKER = REPO / "bench" / "llama_cpp_worker.py"
PINS = ("llama-cpp-python==0.3.36", "diskcache==5.6.3", "jinja2==3.1.6", "markupsafe==3.0.4", "numpy==2.4.6",
        "typing-extensions==4.16.0")
"""llama-cpp-python and its dependencies, pinned (resolved under the project's exclude-newer)."""
_ISA_FLAGS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
              ("bmi2", "GGML_BMI2"), ("avx512f", "GGML_AVX512"), ("avx512vbmi", "GGML_AVX512_VBMI"),
              ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"), ("avx_vnni", "GGML_AVX_VNNI"))
"""/proc/cpuinfo flag -> llama.cpp's CMake option (ggml/CMakeLists.txt) for the explicit build."""


def _log(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv") or str(REPO / ".venv-tools" / "bin" / "uv")
    if not Path(uv).exists() and not shutil.which(uv):
        raise SystemExit("[llama.cpp] no uv found (make uv installs one into .venv-tools)")
    return uv


def explicit_cmake_args() -> str:
    """CMake options for a build with this CPU's ISA spelled out instead of -march=native."""
    flags: set[str] = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    on = [opt for flag, opt in _ISA_FLAGS if flag in flags]
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{opt}=ON" for opt in on)])


def python() -> Path:
    return VENV / "bin" / "python"


def _record() -> dict[str, str]:
    try:
        return dict(json.loads(RECORD.read_text()))
    except (OSError, ValueError):
        return {}


def build(cmake_args: str, flavor: str) -> None:
    """A fresh .venv-llama-cpp with llama-cpp-python compiled from its sdist with ``cmake_args``."""
    uv = _uv()
    exclude = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["uv"]["exclude-newer"]
    _log(f"building llama-cpp-python from its sdist ({flavor}: {cmake_args or 'defaults'}); minutes, once")
    subprocess.run([uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(VENV)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(VENV), "CMAKE_ARGS": cmake_args, "FORCE_CMAKE": "1",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    subprocess.run([uv, "pip", "install", "--quiet", "--no-cache", "--exclude-newer", exclude,
                    "--no-binary", "llama-cpp-python", *PINS], check=True, env=env, cwd=VENV)
    RECORD.write_text(json.dumps({"pins": list(PINS), "cmake_args": cmake_args, "flavor": flavor}))


def smoke(model: Path) -> int:
    """The worker's exit status on 8 tokens of ``model``: 0 runs; negative: killed by that signal."""
    proc = subprocess.run([str(python()), str(WORKER), str(model), "--smoke", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    return proc.returncode


def ensure(model: Path) -> tuple[Path | None, str]:
    """The interpreter of a working llama.cpp build for ``model`` (built if needed) and which build it is; (None,
    why) when no build runs here."""
    rec = _record()
    same = rec.get("pins") == list(PINS) and (rec.get("flavor") != "explicit ISA"
                                             or rec.get("cmake_args") == explicit_cmake_args())
    if python().exists() and same and smoke(model) == 0:
        return python(), rec.get("flavor", "?")
    tries = [("", "native"), (explicit_cmake_args(), "explicit ISA")]
    if rec.get("flavor") == "explicit ISA":  # the native build crashed here before
        tries = tries[1:]
    status = 0
    for cmake_args, flavor in tries:
        build(cmake_args, flavor)
        status = smoke(model)
        if status == 0:
            return python(), flavor
        why = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        _log(f"the {flavor} build does not run here ({why})"
             + ("; rebuilding with the ISA set explicitly" if flavor == "native" else ""))
    return None, f"no llama.cpp build runs here (last: exit {status})"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    exe, flavor = ensure(Path(sys.argv[1]))
    print(exe if exe else flavor)
    sys.exit(0 if exe else 1)
