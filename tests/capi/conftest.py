"""Fixtures of the C API tests: the C programs of native/ built against the installed libuaii, and a runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
SKIP = 77  # what a C test returns when it skips (autotools convention)


def _c_env(**extra: str) -> dict[str, str]:
    """The environment a C program runs in: this interpreter's virtual environment is the one libuaii uses."""
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def c_env() -> Callable[..., dict[str, str]]:
    """``c_env(NAME=value, ...)``: the environment for a C program, with extra variables."""
    return _c_env


@pytest.fixture(scope="session")
def native_dir() -> Path:
    return NATIVE


@pytest.fixture(scope="session")
def c_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """native/ (tests, examples, pkg-config file) built by its Makefile with `python -m uaii.capi` flags."""
    for tool in ("make", "cc"):
        if shutil.which(tool) is None:
            pytest.fail(f"the C API tests need `{tool}` on PATH")
    build = tmp_path_factory.mktemp("uaii-native")
    proc = subprocess.run(["make", "-C", str(NATIVE), f"PYTHON={sys.executable}", f"BUILD={build}", "all"],
                          capture_output=True, text=True, env=_c_env(), timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"building native/ failed:\n{proc.stdout}\n{proc.stderr}")
    return build


RunC = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_c() -> RunC:
    """Run a C program; a failure shows its output, exit code 77 skips."""

    def run(argv: list[str | os.PathLike[str]], *, env: dict[str, str] | None = None, timeout: float = 600,
            prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [*(prefix or []), *map(str, argv)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env or _c_env(), timeout=timeout)
        if proc.returncode == SKIP:
            pytest.skip(proc.stdout.strip() or f"{argv[0]} skipped")
        assert proc.returncode == 0, (f"{' '.join(cmd)} exited with {proc.returncode}\n--- stdout\n{proc.stdout}"
                                      f"\n--- stderr\n{proc.stderr[-20000:]}")
        return proc

    return run
