"""Tiny GGUF vocabularies against llama.cpp: 16 byte-level BPE pre-tokenizer types, SentencePiece with and without
add_space_prefix (user-defined pieces included), BERT WordPiece.

tests/golden/tokenizers/tiny.json holds each vocabulary and llama.cpp's answers on a set of texts
(`scripts/gen_tokenizer_golden.py --tiny`); the test writes the same GGUF files again with `tiny_gguf.py`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from uaii.tokenizers import load

HERE = Path(__file__).resolve().parent
DOC: dict[str, Any] = json.loads((HERE.parent / "golden" / "tokenizers" / "tiny.json").read_text(encoding="utf-8"))


def _tiny_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("uaii_tests_tokenizers_tiny_gguf", HERE / "tiny_gguf.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", sorted(DOC["configs"]))
def test_tiny_vocabulary_matches_llama_cpp(name: str, tmp_path: Path) -> None:
    config = DOC["configs"][name]
    tok = load(_tiny_module().write_tiny_gguf(tmp_path / f"{name}.gguf", config["spec"]))
    bad = []
    for text, (ids, ids_special, text_out) in zip(DOC["texts"], config["results"], strict=True):
        got = (tok.encode(text), tok.encode(text, parse_special=True), tok.decode(ids))
        if got != (ids, ids_special, text_out):
            bad.append(f"{text[:40]!r}: got {got} want {(ids, ids_special, text_out)}")
    assert not bad, f"{len(bad)}/{len(DOC['texts'])} differ from llama.cpp:\n" + "\n".join(b[:400] for b in bad[:5])


def test_tiny_golden_covers_the_kinds() -> None:
    kinds = {c["spec"]["model"] for c in DOC["configs"].values()}
    assert kinds == {"gpt2", "llama", "bert"}
    assert len(DOC["texts"]) >= 60 and DOC["reference"]["tool"] == "llama-cpp-python"
