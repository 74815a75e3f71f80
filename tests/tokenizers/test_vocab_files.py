"""SentencePiece `.model` files and `vocab.txt` vocabularies (WordPiece and simple), built by the tests."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import sentencepiece as spm

from uaii.tokenizers import PieceTokenizer, load

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
          "Tokenizers split text into pieces.", "Numbers 0 1 2 3 42 1234", "Привет мир", "你好世界",
          "I'm sure they're fine.", "café naïve résumé"] * 30
TEXTS = ["Hello world", "The lazy fox.", "  spaced  out  ", "unseen ✨ symbols Ωζ", "Привет", "12345",
         "<s> literal </s>", "", "tabs\tand\nnewlines"]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def sp_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(f"sp-{request.param}")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=330,
                                   model_type=request.param, byte_fallback=True, character_coverage=1.0,
                                   minloglevel=2)
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    return directory


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_matches_sentencepiece(sp_dir: Path, text: str) -> None:
    tok = load(sp_dir)
    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    assert isinstance(tok, PieceTokenizer) and tok.kind == "sentencepiece"
    assert tok.add_bos and tok.bos_id == sp.bos_id()
    assert tok.encode(text) == [sp.bos_id(), *sp.encode(text)]
    assert tok.encode(text, add_special=False) == sp.encode(text)
    assert tok.decode(sp.encode(text)) == sp.decode(sp.encode(text))


def test_sentencepiece_special_parsing_and_config(sp_dir: Path, tmp_path: Path) -> None:
    tok = load(sp_dir / "tokenizer.model")
    ids = tok.encode("a</s>b", add_special=False, parse_special=True)
    assert tok.eos_id in ids and tok.eos_id not in tok.encode("a</s>b", add_special=False)
    (tmp_path / "tokenizer.model").write_bytes((sp_dir / "tokenizer.model").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "add_eos_token": True}))
    tok = load(tmp_path)
    assert tok.encode("Hello")[-1] == tok.eos_id and tok.encode("Hello")[0] != tok.bos_id


def test_bert_vocab_txt_matches_transformers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "hello", "world", "un",
             "##seen", "##s", "!", ",", ".", "?", "'", "a", "b", "##b", "你", "好", "caf", "##e", "na", "##ive"]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                "do_lower_case": True}), encoding="utf-8")
    ours, ref = load(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours.kind == "vocab.txt:wordpiece"
    texts = ["Hello, World!", "the quick brown foxes", "unseen words", "Café naïve 你好", "ab abb", "", "x [SEP] y"]
    for text in texts:
        ids = ref(text)["input_ids"]
        assert ours.encode(text, parse_special=True) == ids
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special=False) == ref.decode(ids)


def test_simple_vocab(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_text("<unk>\n<s>\n</s>\nhello\nworld\n,\n!\n42\n", encoding="utf-8")
    tok = load(tmp_path)
    assert tok.kind == "vocab.txt:simple" and tok.vocab_size == 8
    assert tok.encode("Hello, world! 42 again") == [0, 5, 4, 6, 7, 0]
    assert tok.encode("hello  \n world") == [3, 4]
    assert tok.decode([3, 5, 4]) == "hello , world"
    assert tok.encode("hello </s> world", parse_special=True) == [3, 2, 4]
    assert tok.encode("hello </s> world") == [3, 0, 0, 0, 0, 4]      # '<', '/', 's', '>' are not in the vocabulary
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.add_bos) == (0, 1, 2, False)
    stream = tok.stream()
    assert "".join(stream.step(i) for i in [3, 5, 4]) + stream.finish() == "hello , world"
