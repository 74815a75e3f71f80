"""Fixtures of the tokenizer tests: the real GGUF tokenizers (loaded once) and their golden files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uaii.tokenizers import Tokenizer, load

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tokenizers"


def _golden(name: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def golden() -> Callable[[str], dict[str, Any]]:
    """golden('smollm2') -> the parsed tests/golden/tokenizers/smollm2.json."""
    return _golden


@pytest.fixture(scope="session")
def smollm2_tok(smollm2_path: Path) -> Tokenizer:
    return load(smollm2_path)


@pytest.fixture(scope="session")
def gemma3_tok(gemma3_path: Path) -> Tokenizer:
    return load(gemma3_path)


@pytest.fixture(scope="session")
def real_tok(request: pytest.FixtureRequest) -> Tokenizer:
    """Parametrize with indirect=True and 'smollm2' or 'gemma3'."""
    return request.getfixturevalue(f"{request.param}_tok")
