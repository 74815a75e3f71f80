"""uaii-capi builds as a wheel and an sdist from its own directory, and the wheel's libuaii serves a C program."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_and_sdist_build_alone_and_work(tmp_path: Path,
                                              run_c: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` sets $UV: make's own uv need not be on PATH
    if uv is None:
        pytest.skip("uv is not installed")
    # uv builds the sdist, then the wheel from the unpacked sdist: nothing outside packages/uaii-capi is used
    proc = subprocess.run([uv, "build", "--package", "uaii-capi", "--out-dir", str(tmp_path / "dist")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    wheel = next((tmp_path / "dist").glob("uaii_capi-*.whl"))
    sdist = next((tmp_path / "dist").glob("uaii_capi-*.tar.gz"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("uaii/capi/libuaii.so", "uaii/capi/include/uaii/c_api/uaii.h",
                 "uaii/capi/include/uaii/c_api/version.h", "uaii/capi/_bootstrap.py", "uaii/capi/_exports.py"):
        assert name in names
    assert not any(n.startswith("uaii/__init__") for n in names)  # PEP 420 namespace
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[-1] for m in tar.getnames()}
    assert {"LICENSE", "build_capi.py", "setup.py", "csrc/uaii_capi.c", "csrc/uaii_capi_embed.h", "csrc/libuaii.map",
            "src/uaii/capi/include/uaii/c_api/uaii.h"} <= members

    # the wheel's library, unpacked alone, serves a C program (its dependencies come from this environment)
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    os.chmod(target / "uaii" / "capi" / "libuaii.so", 0o755)
    libdir = target / "uaii" / "capi"
    exe = tmp_path / "v030"
    cc = subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", f"-I{libdir / 'include'}",
                         str(REPO / "native" / "tests" / "test_v030_surface.c"), "-o", str(exe), f"-L{libdir}",
                         f"-Wl,-rpath,{libdir}", "-luaii"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    env = dict(os.environ, VIRTUAL_ENV=sys.prefix)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = run_c([exe, scratch], env=env)
    assert "checks passed" in out.stdout
