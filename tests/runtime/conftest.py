"""Fixtures of the uaii-runtime tests: tiny transformers models (via tests/loaders/loader_helpers.py) and helpers.

``tiny`` and ``talking`` are built once per test run and shared by the modules that use them; nothing writes into
their folders (plan caches go to each test's ``UAII_CACHE_DIR``). test_cli_errors.py defines its own ``tiny`` (a
GGUF written by that module), which takes precedence there.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from uaii.runtime.ray_support import UV_HOOK_ENV

# Ray's workers run this interpreter, not `uv run` again (`make test` runs pytest under uv run; see
# uaii.runtime.ray_support): the test modules import Ray themselves, before any uaii entry point could say so.
os.environ.setdefault(UV_HOOK_ENV, "0")

_HELPERS = Path(__file__).resolve().parents[1] / "loaders" / "loader_helpers.py"
if "loader_helpers" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("loader_helpers", _HELPERS)
    assert _spec is not None and _spec.loader is not None
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["loader_helpers"] = _mod
    _spec.loader.exec_module(_mod)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """loader_helpers' tiny llama (RoPE, 128 positions, 64 tokens) as a transformers directory named ``llama``."""
    import loader_helpers as H

    return H.save_tiny("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def talking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same llama as a GGUF with a character-level vocabulary and a chat template (tests/chat_gguf.py)."""
    import chat_gguf

    return chat_gguf.chat_llama(tmp_path_factory.mktemp("talking"))


@pytest.fixture(scope="module")
def gpu() -> Any:
    """CUDA device 0, opened once per module (skips with "no CUDA device" without one)."""
    from uaii.backends.cuda.device import first_device

    dev = first_device()
    if dev is None:
        pytest.skip("no CUDA device")
    yield dev
    dev.close()
