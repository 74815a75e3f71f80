"""SentencePiece BPE over a GGUF vocabulary, as llama.cpp's ``llm_tokenizer_spm_session`` does it.

Why not the sentencepiece library: handed a 262,144-piece vocabulary it holds ~31 MiB of C++ objects, more than
this whole tokenizer may cost, and its rules differ from llama.cpp's in corners (unused and repeated pieces) that
needed patching. Over the compact `StringTable` the algorithm is short:

1. spaces become '▁'; pairs of adjacent symbols merge while their concatenation is a vocabulary piece of any type,
   the highest-scoring piece first (see `merging`);
2. each final symbol is its piece's id; a character that no piece covers becomes its bytes' ``<0xXX>`` pieces (or
   the one-byte piece, as llama.cpp's ``byte_to_token``), and without either the unknown id. (llama.cpp's
   ``rev_merge`` split-back never applies: a symbol made by a merge is a piece, or it would not have been merged.)
"""

from __future__ import annotations

import numpy as np

from uaii.tokenizers.errors import TokenizerError
from uaii.tokenizers.merging import merge
from uaii.tokenizers.string_table import StringTable

_ESCAPED = "\u2581".encode()


def utf8_bytes(text: str) -> bytes:
    """UTF-8 of `text`; lone surrogates (text decoded with surrogateescape, or not) are kept, never an error."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return text.encode("utf-8", "surrogatepass")


class SpmEncoder:
    """Encodes text fragments to ids over a piece table and its scores (module docstring)."""

    def __init__(self, pieces: StringTable, scores: np.ndarray, unk_id: int | None) -> None:
        if len(scores) != len(pieces):
            raise ValueError(f"{len(scores)} scores for {len(pieces)} pieces")
        self._pieces = pieces
        self._scores = np.ascontiguousarray(scores, dtype=np.float32).data   # a memoryview: items are Python floats
        self._unk = unk_id
        self._byte_ids = [self._byte_id(b) for b in range(256)]

    def _byte_id(self, b: int) -> int | None:
        found = self._pieces.find(f"<0x{b:02X}>".encode())
        return found if found is not None else self._pieces.find(bytes([b]))

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> list[int]:
        find, scores = self._pieces.find, self._scores
        ids: dict[bytes, int | None] = {}          # lookups of this text, shared by the merge loop and the output

        def key(piece: bytes, _left: int) -> float | None:
            tid = ids.get(piece, -1)
            if tid == -1:
                tid = ids[piece] = find(piece)
            return None if tid is None else -scores[tid]

        out: list[int] = []
        for symbol in merge(utf8_bytes(text).replace(b" ", _ESCAPED), key):
            tid = ids[symbol] if symbol in ids else find(symbol)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._bytes_of(symbol))
        return out

    def _bytes_of(self, piece: bytes) -> list[int]:
        ids = [self._byte_ids[b] for b in piece]
        if all(i is not None for i in ids):
            return ids  # type: ignore[return-value]
        if self._unk is None:
            raise TokenizerError(f"text {piece.decode('utf-8', 'replace')!r} has no piece in the vocabulary, "
                                 "which has neither byte pieces nor an unknown token")
        return [self._unk]
