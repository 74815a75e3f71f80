"""Vocabulary files with one token per line (`vocab.txt`).

* A BERT WordPiece vocabulary (it has [CLS], [SEP] and '##' continuation pieces) becomes the HF `tokenizers`
  WordPiece tokenizer that transformers' `BertTokenizerFast` builds: BERT normalization (lower-case per
  `do_lower_case`, default True), whitespace/punctuation split, [CLS] ... [SEP].
* Anything else is a *simple vocabulary*: text is split into words (runs of letters/digits/underscore) and single
  punctuation characters, whitespace is dropped, each piece is looked up, and a piece not in the vocabulary
  becomes `<unk>` (which the vocabulary must contain). Decoding joins the pieces with single spaces.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tokenizers import Tokenizer as HFCore
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors
from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.hf import HFTokenizer, chat_template_of, load_config
from uaii.tokenizers.pieces import CONTROL, NORMAL, UNKNOWN, PieceTokenizer
from uaii.tokenizers.tokenizer import Tokenizer

_WORDS = re.compile(r"\w+|[^\w\s]")
_SPECIAL = re.compile(r"<[^<>\s]+>|\[[A-Z_]+\]")      # <s>, </s>, <unk>, <pad>, [CLS], [MASK] ...
_BOS_NAMES, _EOS_NAMES, _PAD_NAMES = ("<s>", "<bos>", "[CLS]"), ("</s>", "<eos>", "[SEP]"), ("<pad>", "[PAD]")


def read_vocab(path: Path) -> list[str]:
    """The lines of a vocabulary file (trailing newline characters removed)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerFormatError("vocabulary is not UTF-8 text", path=str(path), offset=exc.start) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not lines:
        raise TokenizerFormatError("vocabulary file is empty", path=str(path), offset=0)
    return lines


def load_vocab_file(path: Path) -> Tokenizer:
    """A `vocab.txt` (or a directory holding one): WordPiece when it is a BERT vocabulary, else simple."""
    file = path / "vocab.txt" if path.is_dir() else path
    pieces = read_vocab(file)
    if {"[CLS]", "[SEP]", "[UNK]"} <= set(pieces) and any(p.startswith("##") for p in pieces):
        return _wordpiece(path, file, pieces)
    return _simple(path, file, pieces)


def _wordpiece(path: Path, file: Path, pieces: list[str]) -> HFTokenizer:
    config = load_config(file.parent)
    vocab = {p: i for i, p in enumerate(pieces)}
    core = HFCore(models.WordPiece(vocab=vocab, unk_token=str(config.get("unk_token", "[UNK]"))))
    lower = bool(config.get("do_lower_case", True))
    strip = config.get("strip_accents")
    core.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=bool(
        config.get("tokenize_chinese_chars", True)), strip_accents=strip, lowercase=lower)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece(prefix="##")
    specials = [p for p in pieces if _SPECIAL.fullmatch(p)]
    core.add_special_tokens(specials)
    cls, sep = "[CLS]", "[SEP]"
    core.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    config = {"bos_token": cls, "eos_token": sep, "unk_token": "[UNK]", "pad_token": "[PAD]",
              "clean_up_tokenization_spaces": True, **config}
    tok = HFTokenizer(core, path=str(path), config=config, directory=file.parent)
    tok.kind = "vocab.txt:wordpiece"
    return tok


def _simple(path: Path, file: Path, pieces: list[str]) -> PieceTokenizer:
    index = {p: i for i, p in enumerate(pieces)}
    unk = index.get("<unk>", index.get("[UNK]"))
    if unk is None:
        raise TokenizerFormatError("a simple vocabulary needs an '<unk>' line for unknown words", path=str(file))
    types = np.full(len(pieces), NORMAL, dtype=np.int32)
    for i, p in enumerate(pieces):
        if _SPECIAL.fullmatch(p):
            types[i] = CONTROL
    types[unk] = UNKNOWN

    def encode(texts: list[str]) -> list[list[int]]:
        return [[index.get(w, unk) for w in _WORDS.findall(t)] for t in texts]

    tok = PieceTokenizer(kind="vocab.txt:simple", path=str(path), pieces=pieces, types=types, encoder=encode,
                         normal_piece="word", strip_first_space="first_text")

    def first(names: tuple[str, ...]) -> int | None:
        return next((index[n] for n in names if n in index), None)

    tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id = first(_BOS_NAMES), first(_EOS_NAMES), first(_PAD_NAMES), unk
    config = load_config(file.parent)
    tok.add_bos = bool(config.get("add_bos_token", False)) and tok.bos_id is not None
    tok.add_eos = bool(config.get("add_eos_token", False)) and tok.eos_id is not None
    tok.chat_template, tok.chat_template_source = chat_template_of(file.parent, config)
    tok._finish_specials()
    return tok
