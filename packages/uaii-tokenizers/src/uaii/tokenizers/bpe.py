"""Byte-level BPE over a GGUF vocabulary and merge list, as llama.cpp's ``llm_tokenizer_bpe_session`` does it.

Why not HF `tokenizers`' BPE model: it keeps its own vocabulary, reverse vocabulary and merge map (~14 MiB for
SmolLM2's 49k pieces, several times that for 150k-piece vocabularies) next to ours, and building it needs a Python
dict and a list of 49k+ tuples first. Here the vocabulary and the merges stay `StringTable`s:

1. the pre-tokenizer (HF `tokenizers`, which runs llama.cpp's regexes; see `pretokenizers`) splits the text into
   words already mapped to GPT-2's byte alphabet;
2. in each word, adjacent symbols merge by the rank of the merge rule ``"left right"`` (the first rule of a text
   wins, as llama.cpp's ``emplace``), lowest rank first (see `merging`); with ``ignore_merges`` a word that is a
   piece is taken whole;
3. each symbol is its piece's id; a symbol that is no piece contributes the pieces of its single bytes that exist.
"""

from __future__ import annotations

from typing import Any

from uaii.tokenizers.merging import PairKey, merge
from uaii.tokenizers.pretokenizers import PreTokenizer
from uaii.tokenizers.spm import utf8_bytes
from uaii.tokenizers.string_table import StringTable


def byte_level_splitter(pre: PreTokenizer) -> Any:
    """HF `tokenizers`' pre-tokenizer for `pre`: the regex splits in order, then the GPT-2 byte mapping."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


class BpeEncoder:
    """Encodes text fragments to ids over a piece table and a merge list (module docstring)."""

    def __init__(self, pieces: StringTable, merges: StringTable, pre: PreTokenizer) -> None:
        self._pieces, self._merges = pieces, merges
        self._ignore_merges = pre.ignore_merges
        self._split = byte_level_splitter(pre)

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode(self, text: str) -> list[int]:
        ranks: dict[tuple[bytes, int], int | None] = {}
        words: dict[str, list[int]] = {}      # this text's words: prose repeats them a lot

        def key(pair: bytes, left: int) -> float | None:
            rank = ranks.get((pair, left), -1)
            if rank == -1:
                rank = ranks[pair, left] = self._rank(pair, left)
            return rank

        out: list[int] = []
        for word, _ in self._split.pre_tokenize_str(text):
            ids = words.get(word)
            if ids is None:
                ids = words[word] = self._word(utf8_bytes(word), key)
            out += ids
        return out

    def _word(self, data: bytes, key: PairKey) -> list[int]:
        find = self._pieces.find
        whole = find(data) if self._ignore_merges else None
        if whole is not None:
            return [whole]
        out: list[int] = []
        for symbol in merge(data, key):
            tid = find(symbol)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(i for b in symbol if (i := find(bytes([b]))) is not None)
        return out

    def _rank(self, pair: bytes, left: int) -> int | None:
        """The rank of the rule that merges ``pair[:left]`` with ``pair[left:]``, if there is one."""
        rank = self._merges.find(pair[:left] + b" " + pair[left:], first=True)
        if rank is None or self._merges.raw(rank).find(b" ", 1) != left:
            return None       # no such rule, or a rule that splits the same text elsewhere
        return rank
