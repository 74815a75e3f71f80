"""Fill-in-the-middle ids: from GGUF metadata (both key families), else from the vocabulary's known FIM pieces (a
whole triple of one family), else none — SmolLM2's vocabulary has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.tokenizers import FimTokens, Tokenizer, from_gguf_metadata, load
from uaii.tokenizers.fim import META_KEYS, PIECES, metadata_ids, vocabulary_ids

BASE = ["<unk>", "<s>", "</s>", "\u2581", *"abcdefghij"]


def _vocab_meta(tokens: list[str], **extra: Any) -> dict[str, Any]:
    n = len(tokens)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": -np.arange(n, dtype=np.float32),
            "tokenizer.ggml.token_type": np.array([2, 3, 3] + [1] * (n - 3), np.int32), **extra}


def _write_gguf(path: Path, tokens: list[str], ids: dict[str, int]) -> Path:
    """A tokenizer-only GGUF (SentencePiece vocabulary) with ``ids`` as ``tokenizer.ggml.<key>_token_id``."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    for key, value in ids.items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("names", META_KEYS)
def test_gguf_metadata_ids_are_used(tmp_path: Path, names: tuple[str, str, str]) -> None:
    """Ids named by the metadata win, whatever their pieces are called (here plain letters)."""
    path = _write_gguf(tmp_path / "fim.gguf", BASE, dict(zip(names, (7, 9, 11), strict=True)))
    fim = load(path).fim_tokens()
    assert fim is not None and (fim.prefix, fim.suffix, fim.middle) == (7, 9, 11)
    assert f"tokenizer.ggml.{names[0]}_token_id" in fim.source


def test_metadata_wins_over_the_vocabulary() -> None:
    tokens = [*BASE, "<fim_prefix>", "<fim_suffix>", "<fim_middle>"]
    keys = {f"tokenizer.ggml.{n}_token_id": i for n, i in zip(META_KEYS[0], (4, 5, 6), strict=True)}
    fim = from_gguf_metadata(_vocab_meta(tokens, **keys), "x.gguf").fim_tokens()
    assert fim is not None and fim[:3] == (4, 5, 6)


@pytest.mark.parametrize("pieces", PIECES, ids=lambda p: p[0])
def test_vocabulary_families_are_found(pieces: tuple[str, str, str]) -> None:
    tokens = [*BASE, pieces[2], "x", pieces[0], pieces[1]]  # out of order: each id is looked up
    tok = from_gguf_metadata(_vocab_meta(tokens), "x.gguf")
    fim = tok.fim_tokens()
    assert fim is not None and fim[:3] == (len(BASE) + 2, len(BASE) + 3, len(BASE))
    assert fim.source.startswith("vocabulary")


def test_a_partial_family_or_bad_metadata_is_no_fim() -> None:
    partial = [*BASE, "<|fim_prefix|>", "<|fim_suffix|>", "<fim_middle>"]  # two families, neither whole
    bad = {"tokenizer.ggml.fim_pre_token_id": 4, "tokenizer.ggml.fim_suf_token_id": 5,
           "tokenizer.ggml.fim_mid_token_id": 999}  # out of the vocabulary: not used
    assert from_gguf_metadata(_vocab_meta(partial, **bad), "x.gguf").fim_tokens() is None


def test_psm_prompt_order() -> None:
    fim = FimTokens(10, 11, 12, "test")
    assert fim.prompt([1, 2], [3]) == [10, 1, 2, 11, 3, 12]
    assert fim.prompt([], [], bos=0) == [0, 10, 11, 12]


def test_smollm2_has_no_fim_tokens(smollm2_tok: Tokenizer) -> None:
    """SmolLM2 keeps StarCoder's <repo_name>, <file_sep>... but not its <fim_*> pieces, and names no FIM ids."""
    assert smollm2_tok.token_to_id("<file_sep>") is not None
    assert smollm2_tok.fim_tokens() is None


_piece = st.text(alphabet="<>|_-▁abcfimprexsuMIDPRESUF", min_size=1, max_size=14)


@settings(max_examples=200, deadline=None)
@given(junk=st.lists(_piece, max_size=30, unique=True), family=st.sampled_from(PIECES), data=st.data())
def test_vocabulary_ids_property(junk: list[str], family: tuple[str, str, str], data: st.DataObject) -> None:
    """Whatever else the vocabulary holds (at any ids), the ids found are one whole family's, in the order prefix,
    suffix, middle, the first family of PIECES that is whole; without one piece of it, that family is not found."""
    vocab = [p for p in junk if p not in family]
    for piece in family:
        vocab.insert(data.draw(st.integers(0, len(vocab))), piece)
    index = {p: i for i, p in enumerate(vocab)}
    whole = [f for f in PIECES if all(p in index for p in f)]
    found = vocabulary_ids(index.get)
    assert found is not None and family in whole
    assert tuple(vocab[i] for i in found[:3]) == whole[0]
    del index[data.draw(st.sampled_from(family))]
    again = vocabulary_ids(index.get)
    if again is not None:
        assert tuple(vocab[i] for i in again[:3]) in whole and tuple(vocab[i] for i in again[:3]) != family


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-5, 40), st.booleans(), st.text(max_size=3),
                                 st.floats(allow_nan=True)), min_size=6, max_size=6))
def test_metadata_ids_property(values: list[Any]) -> None:
    """Any metadata values: either a whole in-range triple of one key family, or None; never an exception."""
    keys = [f"tokenizer.ggml.{n}_token_id" for names in META_KEYS for n in names]
    meta = dict(zip(keys, values, strict=True))
    found = metadata_ids(meta, 32)
    if found is None:
        return
    triple = [meta[k] for k in (keys[:3] if found.source.endswith(keys[2]) else keys[3:])]
    assert list(found[:3]) == triple and all(type(v) is int and 0 <= v < 32 for v in triple)
