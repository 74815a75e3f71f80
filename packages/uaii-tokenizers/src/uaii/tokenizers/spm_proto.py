"""Build a SentencePiece BPE model (a serialized `ModelProto`) from a GGUF vocabulary, for llama.cpp-identical ids.

llama.cpp's SPM tokenizer is a port of sentencepiece's BPE encoder: repeatedly merge the adjacent pair whose
concatenation is the highest-scoring vocabulary piece (leftmost on ties), then fall back to <0xXX> byte pieces.
Handing sentencepiece itself the GGUF pieces, scores and types therefore reproduces llama.cpp, with two
adjustments that mirror llama.cpp rather than sentencepiece:

* llama.cpp merges into any vocabulary entry, so control, user-defined and unused pieces are written as NORMAL
  (user-defined and, when asked, control tokens are split out of the text before this model sees it);
* the normalizer is the identity with whitespace escaping only (' ' -> '▁'), no dummy prefix and no collapsing of
  spaces: llama.cpp adds the prefix space itself (`tokenizer.ggml.add_space_prefix`).

The protobuf wire format is written by hand (a few fields), so no protobuf runtime is needed.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BPE = 2
_F32 = struct.Struct("<f")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value & 0xFFFFFFFFFFFFFFFF)


def _piece(text: bytes, score: float, ptype: int) -> bytes:
    body = b"\x0a" + _varint(len(text)) + text + b"\x15" + _F32.pack(score) + b"\x18" + _varint(ptype)
    return b"\x0a" + _varint(len(body)) + body


def sentencepiece_types(types: np.ndarray) -> list[int]:
    """Map GGUF token types (same numbers as sentencepiece's) to the types written into the model."""
    out = []
    for t in types.tolist():
        out.append(t if t in (UNKNOWN, BYTE) else NORMAL)
    return out


def build_model_proto(pieces: Sequence[str], scores: np.ndarray, types: Sequence[int], *, unk_id: int,
                      byte_fallback: bool) -> bytes:
    """Serialize a BPE `ModelProto`; `pieces` must be unique and non-empty (see `unique_pieces`)."""
    parts = [_piece(p.encode("utf-8", "surrogateescape"), float(s), t)
             for p, s, t in zip(pieces, scores.tolist(), types, strict=True)]
    trainer = (_field_varint(3, _BPE) + _field_varint(4, len(pieces)) + _field_varint(35, int(byte_fallback))
               + _field_varint(40, unk_id) + _field_varint(41, -1) + _field_varint(42, -1) + _field_varint(43, -1))
    normalizer = (_field_bytes(1, b"identity") + _field_varint(3, 0) + _field_varint(4, 0) + _field_varint(5, 1))
    return b"".join(parts) + _field_bytes(2, trainer) + _field_bytes(3, normalizer)


def unique_pieces(pieces: Sequence[str], types: list[int]) -> list[str]:
    """Pieces made acceptable to sentencepiece: an empty or repeated piece is renamed and marked UNUSED.

    llama.cpp maps a repeated text to its last id; sentencepiece rejects repeats, so earlier copies get a
    placeholder name that no text can produce.
    """
    last: dict[str, int] = {}
    for i, p in enumerate(pieces):
        last[p] = i
    if len(last) == len(pieces) and "" not in last:
        return list(pieces)
    out = list(pieces)
    for i, p in enumerate(pieces):
        if p == "" or last[p] != i:
            out[i] = f"\u0000uaii-placeholder-{i}\u0000"
            types[i] = UNUSED
    return out
