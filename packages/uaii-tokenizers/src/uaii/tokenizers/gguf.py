"""Tokenizers from GGUF metadata (`tokenizer.ggml.*`), matching llama.cpp's ids.

* ``gpt2``  byte-level BPE: HF `tokenizers` BPE over the GGUF vocabulary and merges, with the pre-tokenizer regexes
  of `tokenizer.ggml.pre` (see `pretokenizers`);
* ``llama`` SentencePiece BPE with scores and byte fallback: a sentencepiece model built from the GGUF pieces
  (see `spm_proto`);
* ``bert``  WordPiece: HF `tokenizers` WordPiece with llama.cpp's normalization (lower-case, strip accents, split
  whitespace, punctuation and CJK), the vocabulary's '▁' word starts turned back into '##' continuations.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import sentencepiece as spm

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
from uaii.tokenizers import spm_proto
from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.gguf_meta import read_metadata
from uaii.tokenizers.pieces import BYTE, CONTROL, NORMAL, UNKNOWN, FragmentEncoder, PieceTokenizer
from uaii.tokenizers.pretokenizers import pre_tokenizer

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
    pieces = _get(meta, _K + "tokens", list, path)
    if not pieces:
        raise TokenizerFormatError(f"GGUF tokenizer has no '{_K}tokens' list", path=path)
    n = len(pieces)
    types = _array(meta, _K + "token_type", n, path, np.full(n, NORMAL, dtype=np.int32)).astype(np.int32)
    scores = _array(meta, _K + "scores", n, path, np.zeros(n, dtype=np.float32)).astype(np.float32)
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
    found = builtin_template(tok._piece_to_id)
    if found is not None:
        tok.chat_template_source, tok.chat_template = found


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
    tok.add_bos = bool(_get(meta, _K + "add_bos_token", bool, path, default_bos))
    tok.add_eos = bool(_get(meta, _K + "add_eos_token", bool, path, False))
    if model == "bert":
        tok.add_sep = bool(_get(meta, _K + "add_sep_token", bool, path, True))


# ------------------------------------------------------------------------------------------------ byte-level BPE
def _gpt2(meta: dict[str, Any], path: str, pieces: list[str], types: np.ndarray, scores: np.ndarray
          ) -> PieceTokenizer:
    pre = pre_tokenizer(_get(meta, _K + "pre", str, path), path=path)
    merges_raw = _get(meta, _K + "merges", list, path)
    if merges_raw is None:
        raise TokenizerFormatError(f"byte-level BPE tokenizer has no '{_K}merges' list", path=path)
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for m in merges_raw:
        cut = m.find(" ", 1)
        if cut < 0:
            raise TokenizerFormatError(f"BPE merge {m!r} has no space between its two parts", path=path)
        a, b = m[:cut], m[cut + 1:]
        if a in vocab and b in vocab and a + b in vocab:   # HF refuses merges outside the vocabulary
            merges.append((a, b))
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    kind = f"gguf:gpt2({pre.name})"
    return PieceTokenizer(kind=kind, path=path, pieces=pieces, types=types, encoder=_hf_encoder(hf),
                          normal_piece="bytelevel", clean_up=pre.clean_spaces)


def _hf_encoder(hf: Tokenizer) -> FragmentEncoder:
    def encode(texts: list[str]) -> list[list[int]]:
        if len(texts) == 1:
            return [hf.encode(texts[0], add_special_tokens=False).ids]
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    return encode


# ------------------------------------------------------------------------------------------- SentencePiece (SPM)
def _llama(meta: dict[str, Any], path: str, pieces: list[str], types: np.ndarray, scores: np.ndarray
           ) -> PieceTokenizer:
    sp_types = spm_proto.sentencepiece_types(types)
    unk_meta = meta.get(_K + "unknown_token_id")
    unk_ids = [i for i, t in enumerate(sp_types) if t == UNKNOWN]
    unk = int(unk_meta) if isinstance(unk_meta, (int, np.integer)) and 0 <= unk_meta < len(pieces) else (
        unk_ids[0] if unk_ids else 0)
    for i in unk_ids:
        sp_types[i] = NORMAL
    sp_types[unk] = UNKNOWN
    names = spm_proto.unique_pieces(pieces, sp_types)
    byte_ids = [i for i, t in enumerate(sp_types) if t == BYTE]
    byte_fallback = len({names[i] for i in byte_ids} & {f"<0x{b:02X}>" for b in range(256)}) == 256
    if not byte_fallback:
        for i in byte_ids:
            sp_types[i] = NORMAL
    proto = spm_proto.build_model_proto(names, scores, sp_types, unk_id=unk, byte_fallback=byte_fallback)
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(proto)
    except (RuntimeError, OSError) as exc:
        raise TokenizerFormatError(f"SentencePiece vocabulary is unusable: {exc}", path=path) from None
    add_space_prefix = bool(_get(meta, _K + "add_space_prefix", bool, path, True))

    def encode(texts: list[str]) -> list[list[int]]:
        return sp.encode(texts)

    tok = PieceTokenizer(kind="gguf:llama", path=path, pieces=pieces, types=types, encoder=encode,
                         normal_piece="spm", add_space_prefix=add_space_prefix)
    tok._sp = sp  # type: ignore[attr-defined]  # keep the processor alive with the tokenizer
    return tok


# ---------------------------------------------------------------------------------------------- WordPiece (BERT)
def _bert(meta: dict[str, Any], path: str, pieces: list[str], types: np.ndarray, scores: np.ndarray
          ) -> PieceTokenizer:
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
