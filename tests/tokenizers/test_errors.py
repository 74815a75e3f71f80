"""Bad input: every failure is a UaiiError that names the file (and the byte offset where the format has one)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gguf
import numpy as np
import pytest

from uaii.ir.errors import UaiiError
from uaii.tokenizers import TokenizerError, TokenizerFormatError, load
from uaii.tokenizers.pieces import byte_decoder


def write_gguf(path: Path, *, model: str = "gpt2", pre: str | None = "llama-bpe", extra: dict | None = None) -> Path:
    """A tiny GGUF holding only tokenizer metadata: the byte-level alphabet, a few merges, two control tokens."""
    alphabet = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    tokens = ["<s>", "</s>", *alphabet, "he", "ll", "llo", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld"]
    merges = ["h e", "l l", "ll o", "he llo", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
    types = [3, 3] + [1] * (len(tokens) - 2)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    for key, value in (extra or {}).items():
        w.add_string(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_gguf_works(tmp_path: Path) -> None:
    tok = load(write_gguf(tmp_path / "t.gguf"))
    ids = tok.encode("hello world")
    assert ids[0] == 0 and tok.id_to_piece(ids[1]) == "hello" and tok.id_to_piece(ids[2]) == "Ġworld"
    assert tok.decode(ids) == "hello world"


def test_missing_path_names_what_is_supported(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"no such file.*gguf.*tokenizer\.json.*sentencepiece.*vocab\.txt"):
        load(tmp_path / "nope.gguf")


def test_unknown_directory(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(TokenizerError, match="no tokenizer found; supported"):
        load(tmp_path)


@pytest.mark.parametrize("model", ["rwkv", "t5", "no_vocab"])
def test_unsupported_gguf_tokenizer_model(tmp_path: Path, model: str) -> None:
    with pytest.raises(TokenizerError, match=f"model '{model}' is not supported; supported: gpt2, llama, bert"):
        load(write_gguf(tmp_path / "m.gguf", model=model))


def test_unknown_pre_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"unknown pre-tokenizer type.*'martian'.*supported:.*llama-bpe"):
        load(write_gguf(tmp_path / "m.gguf", pre="martian"))


def test_gguf_without_tokenizer(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "w.gguf"), arch="llama")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="has no tokenizer"):
        load(tmp_path / "w.gguf")


def test_truncated_gguf_at_every_region(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "full.gguf").read_bytes()
    cut_file = tmp_path / "cut.gguf"
    offsets_seen = set()
    for cut in [*range(0, 64), *range(64, len(data), 97)]:
        cut_file.write_bytes(data[:cut])
        with pytest.raises(TokenizerFormatError) as info:
            load(cut_file)
        msg = str(info.value)
        assert msg.startswith("[tokenizer] ") and str(cut_file) in msg
        if info.value.offset is not None:
            assert 0 <= info.value.offset <= cut
            offsets_seen.add(info.value.offset)
    assert len(offsets_seen) > 10           # the offset says where, not just "somewhere"


def test_truncated_real_model_header(tmp_path: Path, smollm2_path: Path) -> None:
    with open(smollm2_path, "rb") as f:
        head = f.read(300_000)              # the vocabulary runs past this point
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head)
    with pytest.raises(TokenizerFormatError, match=r"tokenizer\.ggml\.(tokens|merges).*truncated.*offset 0x"):
        load(cut)


def test_corrupt_gguf_fuzz(tmp_path: Path) -> None:
    """Random byte changes give a tokenizer or a UaiiError, never another exception."""
    data = bytearray(write_gguf(tmp_path / "full.gguf").read_bytes())
    rng = random.Random(7)
    bad = tmp_path / "bad.gguf"
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(min(len(mutated), 4096))
            mutated[pos] = rng.randrange(256)
        bad.write_bytes(bytes(mutated))
        try:
            tok = load(bad)
            tok.decode(tok.encode("hello world"))
        except UaiiError as exc:
            assert str(exc).startswith("[")


def test_not_gguf_magic(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + b"\0" * 60)
    with pytest.raises(TokenizerFormatError, match=r"not a GGUF file.*offset 0x0"):
        load(path)


def test_broken_tokenizer_json_gives_offset(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {', encoding="utf-8")
    with pytest.raises(TokenizerFormatError, match=r"tokenizer\.json: invalid JSON.*offset 0x1d"):
        load(tmp_path)


def test_tokenizer_json_of_wrong_shape(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Nope"}}), encoding="utf-8")
    with pytest.raises(TokenizerFormatError, match=r"not a tokenizer\.json HF tokenizers can load"):
        load(tmp_path)


def test_broken_tokenizer_config(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(TokenizerFormatError, match=r"tokenizer_config\.json: not UTF-8.*offset 0x0"):
        load(tmp_path)


def test_corrupt_sentencepiece_model(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\xff\xff\xff\x0f garbage")
    with pytest.raises(TokenizerFormatError, match=r"tokenizer\.model: not a SentencePiece model"):
        load(tmp_path)


def test_bad_vocab_files(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_bytes(b"hello\n\xc3(\n")
    with pytest.raises(TokenizerFormatError, match=r"not UTF-8.*offset 0x6"):
        load(tmp_path)
    (tmp_path / "vocab.txt").write_text("hello\nworld\n", encoding="utf-8")
    with pytest.raises(TokenizerFormatError, match="needs an '<unk>' line"):
        load(tmp_path)


def test_bad_arguments(smollm2_tok) -> None:
    with pytest.raises(TokenizerError, match="takes a str"):
        smollm2_tok.encode(b"bytes")
    with pytest.raises(TokenizerError, match="out of range"):
        smollm2_tok.id_to_piece(10**9)
    with pytest.raises(TokenizerError, match="out of range"):
        smollm2_tok.decode([10**9])
