"""Tokenizers from GGUF metadata (`tokenizer.ggml.*`), matching llama.cpp's ids.

* ``gpt2``  byte-level BPE: llama.cpp's algorithm over the GGUF vocabulary and merges (see `bpe`), after the
  pre-tokenizer regexes of `tokenizer.ggml.pre` (see `pretokenizers`);
* ``llama`` SentencePiece BPE with scores and byte fallback: llama.cpp's algorithm over the compact piece table
  (see `spm`);
* ``bert``  WordPiece: HF `tokenizers` WordPiece with llama.cpp's normalization (lower-case, strip accents, split
  whitespace, punctuation and CJK), the vocabulary's '▁' word starts turned back into '##' continuations.

The vocabulary stays a `StringTable` (one blob, offsets, a hash index) from the metadata reader to the tokenizer:
Gemma 3's 262,144 pieces never become 262,144 Python strings. HF `tokenizers` (pre-tokenizer regexes, WordPiece) is
imported only for the models that use it: it is ~3 MiB of RSS that a SentencePiece model does not need.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.tokenizers.bpe import BpeEncoder
from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.fim import metadata_ids
from uaii.tokenizers.gguf_meta import read_metadata
from uaii.tokenizers.pieces import CONTROL, NORMAL, UNKNOWN, FragmentEncoder, PieceTokenizer
from uaii.tokenizers.pretokenizers import pre_tokenizer
from uaii.tokenizers.spm import SpmEncoder
from uaii.tokenizers.string_table import StringTable

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SUPPORTED_MODELS = ("gpt2", "llama", "bert")
_K = "tokenizer.ggml."


def load_gguf(path: str | os.PathLike[str]) -> PieceTokenizer:
    """The tokenizer described by a GGUF file's metadata."""
    path = os.fspath(path)
    return from_metadata(read_metadata(path), path)


def _get(meta: dict[str, Any], key: str, kind: type, path: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    if value is None or isinstance(value, kind):
        return value
    raise TokenizerFormatError(f"metadata '{key}' should be {kind.__name__}, found {type(value).__name__}", path=path)


def from_metadata(meta: dict[str, Any], path: str) -> PieceTokenizer:
    """Build the tokenizer from parsed GGUF metadata (`read_metadata`)."""
    model = _get(meta, _K + "model", str, path)
    if model is None:
        raise TokenizerError(f"{path}: GGUF has no tokenizer (no '{_K}model' key); supported tokenizer models: "
                             + ", ".join(SUPPORTED_MODELS))
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(f"{path}: tokenizer model {model!r} is not supported; supported: "
                             + ", ".join(SUPPORTED_MODELS))
    pieces = _strings(meta, _K + "tokens", path)
    if not pieces:
        raise TokenizerFormatError(f"GGUF tokenizer has no '{_K}tokens' list", path=path)
    n = len(pieces)
    types = _array(meta, _K + "token_type", n, path, np.full(n, NORMAL, dtype=np.int8))
    if len(types) and (types.min() < 0 or types.max() > 127):    # kept as int8; a value out of range is no type
        types = np.clip(types, 0, 127)
    types = types.astype(np.int8)
    scores = _array(meta, _K + "scores", n, path, np.zeros(n, dtype=np.float32)).astype(np.float32, copy=False)
    build = {"gpt2": _gpt2, "llama": _llama, "bert": _bert}[model]
    tok = build(meta, path, pieces, types, scores)
    default_bos = {"llama": True, "bert": True}.get(model) or (
        model == "gpt2" and pre_tokenizer(meta.get(_K + "pre"), path=path).add_bos)
    _set_specials(tok, meta, path, model, default_bos)
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        tok.chat_template, tok.chat_template_source = template, "gguf"
    tok._finish_specials()
    if tok.chat_template is None:
        _builtin_template(tok)
    return tok


def _builtin_template(tok: PieceTokenizer) -> None:
    from uaii.tokenizers.chat import builtin_template
    found = builtin_template(tok.pieces)
    if found is not None:
        tok.chat_template_source, tok.chat_template = found


def _strings(meta: dict[str, Any], key: str, path: str) -> StringTable | None:
    value = meta.get(key)
    if value is None or isinstance(value, StringTable):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes) and all(isinstance(v, str) for v in value):
        return StringTable.from_strings(value)
    raise TokenizerFormatError(f"metadata '{key}' should be a list of strings, found {type(value).__name__}", path=path)


def _array(meta: dict[str, Any], key: str, n: int, path: str, default: np.ndarray) -> np.ndarray:
    value = meta.get(key)
    if value is None:
        return default
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iuf":
        raise TokenizerFormatError(f"metadata '{key}' should be a numeric array", path=path)
    if len(value) < n:
        raise TokenizerFormatError(f"metadata '{key}' has {len(value)} entries for {n} tokens", path=path)
    return value[:n]


def _set_specials(tok: PieceTokenizer, meta: dict[str, Any], path: str, model: str, default_bos: bool) -> None:
    defaults = {"llama": (1, 2, 0, None, None), "bert": (101, None, 100, 102, 0), "gpt2": (11, 11, None, None, None)}
    bos, eos, unk, sep, pad = defaults[model]
    n = tok.vocab_size

    def special(name: str, default: int | None) -> int | None:
        value = meta.get(f"{_K}{name}_token_id")
        if isinstance(value, (int, np.integer)) and 0 <= int(value) < n:
            return int(value)
        return default if default is not None and default < n else None

    tok.bos_id, tok.eos_id = special("bos", bos), special("eos", eos)
    tok.unk_id, tok.sep_id, tok.pad_id = special("unknown", unk), special("seperator", sep), special("padding", pad)
    tok.eot_id = special("eot", None)
    tok._fim_meta = metadata_ids(meta, n)
    tok.add_bos = bool(_get(meta, _K + "add_bos_token", bool, path, default_bos))
    tok.add_eos = bool(_get(meta, _K + "add_eos_token", bool, path, False))
    if model == "bert":
        tok.add_sep = bool(_get(meta, _K + "add_sep_token", bool, path, True))


# ------------------------------------------------------------------------------------------------ byte-level BPE
def _gpt2(meta: dict[str, Any], path: str, pieces: StringTable, types: np.ndarray, scores: np.ndarray
          ) -> PieceTokenizer:
    pre = pre_tokenizer(_get(meta, _K + "pre", str, path), path=path)
    merges = _strings(meta, _K + "merges", path)
    if merges is None:
        raise TokenizerFormatError(f"byte-level BPE tokenizer has no '{_K}merges' list", path=path)
    return PieceTokenizer(kind=f"gguf:gpt2({pre.name})", path=path, pieces=pieces, types=types,
                          encoder=BpeEncoder(pieces, merges, pre), normal_piece="bytelevel", clean_up=pre.clean_spaces)


# ------------------------------------------------------------------------------------------- SentencePiece (SPM)
def _llama(meta: dict[str, Any], path: str, pieces: StringTable, types: np.ndarray, scores: np.ndarray
           ) -> PieceTokenizer:
    unk_meta = meta.get(_K + "unknown_token_id")
    unk_ids = np.flatnonzero(types == UNKNOWN)
    unk = int(unk_meta) if isinstance(unk_meta, (int, np.integer)) and 0 <= unk_meta < len(pieces) else (
        int(unk_ids[0]) if len(unk_ids) else 0)
    add_space_prefix = bool(_get(meta, _K + "add_space_prefix", bool, path, True))
    return PieceTokenizer(kind="gguf:llama", path=path, pieces=pieces, types=types,
                          encoder=SpmEncoder(pieces, scores, unk), normal_piece="spm",
                          add_space_prefix=add_space_prefix)


# ---------------------------------------------------------------------------------------------- WordPiece (BERT)
def _bert(meta: dict[str, Any], path: str, pieces: StringTable, types: np.ndarray, scores: np.ndarray
          ) -> PieceTokenizer:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab: dict[str, int] = {}
    for i, (p, t) in enumerate(zip(pieces, types.tolist(), strict=True)):
        if t == CONTROL:
            name = p
        elif p.startswith("\u2581"):
            name = p[1:]
        else:
            name = "##" + p
        vocab[name] = i
    unk = meta.get(_K + "unknown_token_id", 100)
    unk_piece = pieces[int(unk)] if isinstance(unk, (int, np.integer)) and 0 <= int(unk) < len(pieces) else "[UNK]"
    lowercase = bool(meta.get(_K + "normalizer.lowercase", True))
    strip_accents = bool(meta.get(_K + "normalizer.strip_accents", lowercase))
    hf = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk_piece, max_input_chars_per_word=1 << 30))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=strip_accents, lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return PieceTokenizer(kind="gguf:bert", path=path, pieces=pieces, types=types, encoder=_hf_encoder(hf),
                          normal_piece="spm", clean_up=True)


def _hf_encoder(hf: Tokenizer) -> FragmentEncoder:
    def encode(texts: list[str]) -> list[list[int]]:
        if len(texts) == 1:
            return [hf.encode(texts[0], add_special_tokens=False).ids]
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    return encode
