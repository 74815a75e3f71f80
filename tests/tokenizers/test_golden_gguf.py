"""The real GGUF models against llama.cpp: ids and detokenized text on the golden corpus.

tests/golden/tokenizers/{smollm2,gemma3}.json hold the corpus and llama.cpp's answers; they are produced by
scripts/gen_tokenizer_golden.py with llama-cpp-python (the version is recorded in each file).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from uaii.tokenizers import Tokenizer, load

MODELS = ["smollm2", "gemma3"]


def _mismatches(tok: Tokenizer, cases: list[dict], field: str) -> list[str]:
    bad = []
    for c in cases:
        text = c["text"]
        if field == "ids":
            got, want = tok.encode(text), c["ids"]
        elif field == "ids_special":
            got, want = tok.encode(text, parse_special=True), c["ids_special"]
        elif field == "text_out":
            got, want = tok.decode(c["ids"]), c["text_out"]
        else:
            got, want = tok.decode(c["ids_special"], skip_special=False), c["text_special_out"]
        if got != want:
            bad.append(f"{text[:60]!r}: got {str(got)[:120]} want {str(want)[:120]}")
    return bad


@pytest.mark.parametrize("real_tok", MODELS, indirect=True)
@pytest.mark.parametrize("field", ["ids", "ids_special", "text_out", "text_special_out"])
def test_matches_llama_cpp(real_tok: Tokenizer, field: str, golden, request: pytest.FixtureRequest) -> None:
    key = request.node.callspec.params["real_tok"]
    doc = golden(key)
    assert doc["reference"]["tool"] == "llama-cpp-python"
    bad = _mismatches(real_tok, doc["cases"], field)
    assert not bad, f"{len(bad)}/{len(doc['cases'])} {field} differ from llama.cpp:\n" + "\n".join(bad[:8])


@pytest.mark.parametrize("key", MODELS)
def test_corpus_covers_the_required_groups(key: str, golden) -> None:
    doc = golden(key)
    assert doc["count"] == len(doc["cases"]) >= 200
    groups = {c["group"] for c in doc["cases"]}
    assert {"english", "code", "whitespace", "digits", "emoji", "scripts", "special-chatml", "special-gemma"} <= groups
    texts = {c["text"] for c in doc["cases"]}
    for must in ("\n\n\n", "\t", "trailing spaces   ", "👨‍👩‍👧‍👦", "你好，世界！", "مرحبا بالعالم", "Привет, мир!",
                 "3141592653589793238462643383279502884197"):
        assert must in texts


@pytest.mark.parametrize("key", MODELS)
def test_golden_is_for_this_model_file(key: str, golden, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(f"{key}_path")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    assert h.hexdigest() == golden(key)["model_sha256"]


def test_smollm2_metadata(smollm2_tok: Tokenizer) -> None:
    t = smollm2_tok
    assert t.kind == "gguf:gpt2(smollm)" and t.vocab_size == 49152
    assert (t.bos_id, t.eos_id, t.add_bos, t.add_eos) == (1, 2, False, False)
    assert t.token_to_id("<|im_end|>") == 2 and t.eot_id == 2
    assert {0, 2} <= t.stop_ids
    assert t.id_to_piece(19556) == "Hello" and t.is_special(1) and not t.is_special(19556)
    assert t.chat_template_source == "gguf"


def test_gemma3_metadata(gemma3_tok: Tokenizer) -> None:
    t = gemma3_tok
    assert t.kind == "gguf:llama" and t.vocab_size == 262144
    assert (t.bos_id, t.eos_id, t.add_bos, t.add_eos) == (2, 1, True, False)
    assert t.eot_id == t.token_to_id("<end_of_turn>") == 106
    assert {1, 106} <= t.stop_ids
    assert t.encode("Hi")[0] == 2 and t.encode("Hi", add_special=False)[0] != 2
    assert t.chat_template_source == "builtin:gemma"


def test_gemma3_loads_fast(gemma3_path: Path) -> None:
    load(gemma3_path)                     # warm the page cache and the imports
    start = time.perf_counter()
    load(gemma3_path)
    assert time.perf_counter() - start < 5.0   # ~0.5 s here; generous for a loaded CI machine
