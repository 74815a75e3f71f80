"""`PieceTokenizer`: a tokenizer over an explicit piece table, with llama.cpp's encode/decode rules.

Used for GGUF vocabularies, SentencePiece `.model` files and simple vocabularies. What differs between them is the
*fragment encoder* (HF `tokenizers` BPE/WordPiece, sentencepiece, a word split) that turns plain text into ids;
around it this class does what llama.cpp's `llama_vocab::tokenize` does:

1. split special tokens out of the text, longest token first (`tokenizer_st_partition`): user-defined tokens always,
   control and unknown tokens only with ``parse_special=True``;
2. encode the remaining text fragments (with a prefix space after a special token when `add_space_prefix`);
3. add BOS / EOS / SEP as the metadata says.

Decoding renders every id as llama.cpp's `token_to_piece` does (byte-level BPE pieces through the GPT-2 byte map,
SentencePiece '▁' as a space, <0xXX> as one byte, control tokens only when asked), joins the bytes and decodes
UTF-8 with replacement, then applies llama.cpp's leading-space removal and space clean-up.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

import numpy as np

from uaii.tokenizers.errors import TokenizerError
from uaii.tokenizers.string_table import StringTable
from uaii.tokenizers.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

FragmentEncoder = Callable[[list[str]], list[list[int]]]
Fragment = str | int

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def partition(text: str, specials: Sequence[tuple[str, int]]) -> list[Fragment]:
    """Split `text` at special tokens, longest first (llama.cpp's `tokenizer_st_partition`): text and ids."""
    frags: list[Fragment] = [text]
    for tok, tid in specials:
        if tok not in text:
            continue
        out: list[Fragment] = []
        for f in frags:
            if isinstance(f, int) or tok not in f:
                out.append(f)
                continue
            for k, part in enumerate(f.split(tok)):
                if k:
                    out.append(tid)
                if part:
                    out.append(part)
        frags = out
    return frags


def clean_spaces(text: str) -> str:
    """llama.cpp's detokenizer clean-up: ' ?' ' !' ' .' ' ,' lose the space, " ' " -> "'", " 's" " 'm" " 're" " 've"."""
    text = re.sub(r" (?=[?!.,])", "", text)
    text = text.replace(" ' ", "'")
    return re.sub(r" (?='(?:[sm]|re|ve))", "", text)


class PieceTokenizer(Tokenizer):
    """A tokenizer over a piece table (module docstring); built by the GGUF, SentencePiece and simple loaders."""

    def __init__(self, *, kind: str, path: str, pieces: Sequence[str], types: np.ndarray, encoder: FragmentEncoder,
                 normal_piece: str = "spm", add_space_prefix: bool = False, clean_up: bool = False,
                 strip_first_space: str = "first_token", sep_id: int | None = None, add_sep: bool = False) -> None:
        self.kind, self.path = kind, path
        # One blob + offsets and a hash table instead of a list and a dict: a 262k vocabulary costs ~5 MiB, not ~45.
        self._pieces = pieces if isinstance(pieces, StringTable) else StringTable.from_strings(pieces)
        self._types = np.asarray(types, dtype=np.int8)
        self._encoder = encoder
        self._normal_piece = normal_piece          # "spm" ('▁' is a space), "bytelevel" (GPT-2 map), "raw", "word"
        self.add_space_prefix = add_space_prefix
        self.cleans_up_spaces = clean_up
        self._strip_first_space = strip_first_space  # "first_token" (llama.cpp), "first_text" (sentencepiece)
        self.sep_id, self.add_sep = sep_id, add_sep
        self._bytes_cache: dict[tuple[int, bool], bytes] = {}
        table = self._pieces
        specials = [i for i in np.flatnonzero(np.isin(self._types, (CONTROL, USER_DEFINED, UNKNOWN))).tolist()
                    if table.raw(i)]
        specials.sort(key=lambda i: -len(table.raw(i)))
        self._always = [(table[i], i) for i in specials if self._types[i] == USER_DEFINED]
        self._all_specials = [(table[i], i) for i in specials]

    # ---------------------------------------------------------------------------------------------------- lookups
    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pieces(self) -> StringTable:
        """Every piece, by id (a read-only sequence of str that also answers `piece in pieces`)."""
        return self._pieces

    def token_to_id(self, piece: str) -> int | None:
        return self._pieces.find(piece)   # last id wins, as in llama.cpp

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < len(self._pieces):
            raise TokenizerError(f"token id {token_id} is out of range (vocabulary of {len(self._pieces)})")
        return self._pieces[token_id]

    def is_special(self, token_id: int) -> bool:
        return 0 <= token_id < len(self._pieces) and int(self._types[token_id]) in (CONTROL, UNKNOWN)

    def token_type(self, token_id: int) -> int:
        """The GGUF/sentencepiece type of an id: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte."""
        return int(self._types[token_id])

    # ---------------------------------------------------------------------------------------------------- encode
    def _encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        frags = partition(text, self._all_specials if parse_special else self._always) if text else []
        texts: list[str] = []
        prev_special = True
        for f in frags:
            if isinstance(f, str):
                texts.append(" " + f if self.add_space_prefix and prev_special else f)
                prev_special = False
            else:
                prev_special = True
        encoded = iter(self._encoder(texts) if texts else [])
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                out.extend(next(encoded))
        if add_special and self.add_eos and self.eos_id is not None:
            out.append(self.eos_id)
        if add_special and self.add_sep and self.sep_id is not None:
            out.append(self.sep_id)
        return out

    # ---------------------------------------------------------------------------------------------------- decode
    def token_bytes(self, token_id: int, *, skip_special: bool = True) -> bytes:
        """The bytes one id contributes to decoded text (llama.cpp's `token_to_piece`)."""
        key = (token_id, skip_special)
        cached = self._bytes_cache.get(key)
        if cached is None:
            cached = self._bytes_cache[key] = self._render(token_id, skip_special)
        return cached

    def _render(self, token_id: int, skip_special: bool) -> bytes:
        text = self.id_to_piece(token_id)
        ttype = int(self._types[token_id])
        if ttype in (CONTROL, UNKNOWN):
            return b"" if skip_special else self._pieces.raw(token_id)
        if ttype == USER_DEFINED:
            return self._pieces.raw(token_id)
        if ttype == BYTE:
            m = _BYTE_PIECE.fullmatch(text)
            return bytes([int(m.group(1), 16)]) if m else b""
        if ttype != NORMAL:
            return b""
        if self._normal_piece == "bytelevel":
            table = byte_decoder()
            return b"".join(bytes([table[c]]) if c in table else c.encode("utf-8", "surrogateescape")
                            for c in text)
        if self._normal_piece == "word":
            return b" " + text.encode("utf-8", "surrogateescape")
        return self._pieces.raw(token_id).replace("\u2581".encode(), b" ")

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        chunks = [self.token_bytes(i, skip_special=skip_special) for i in ids]
        if self._strip_first_space == "first_token" and self.add_space_prefix and chunks:
            if chunks[0].startswith(b" "):
                chunks[0] = chunks[0][1:]
        elif self._strip_first_space == "first_text":
            for k, c in enumerate(chunks):
                if c:
                    chunks[k] = c[1:] if c.startswith(b" ") else c
                    break
        text = b"".join(chunks).decode("utf-8", errors="replace")
        return clean_spaces(text) if self.cleans_up_spaces else text
