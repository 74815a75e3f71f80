"""Fill-in-the-middle tokens: the three ids a code model was trained to read as "prefix, suffix, now the middle".

A FIM prompt (PSM order) is ``<PRE> prefix <SUF> suffix <MID>``; the model then writes the middle. Which ids those
are is found the way llama.cpp's vocabulary does it:

1. the GGUF metadata ``tokenizer.ggml.fim_pre_token_id`` / ``fim_suf_token_id`` / ``fim_mid_token_id``, or the older
   ``tokenizer.ggml.prefix_token_id`` / ``suffix_token_id`` / ``middle_token_id`` that converters wrote for
   CodeLlama and CodeGemma (:func:`metadata_ids`, read by the GGUF loader);
2. else the vocabulary's known FIM pieces, a whole triple of one family: Qwen2.5-Coder ``<|fim_prefix|>``...,
   StarCoder/SantaCoder ``<fim_prefix>``..., ``<fim-prefix>``..., DeepSeek-Coder ``<｜fim▁begin｜>`` /
   ``<｜fim▁hole｜>`` / ``<｜fim▁end｜>``, CodeLlama ``▁<PRE>`` / ``▁<SUF>`` / ``▁<MID>`` (``<PRE>``... in HF
   vocabularies), CodeGeeX ``<|code_prefix|>``... (:func:`vocabulary_ids`).

A triple is used whole or not at all: a vocabulary with ``<fim_prefix>`` but no ``<fim_middle>`` has no FIM.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

META_KEYS = (("fim_pre", "fim_suf", "fim_mid"), ("prefix", "suffix", "middle"))
PIECES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
    ("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),  # CodeLlama (SentencePiece pieces)
    ("<PRE>", "<SUF>", "<MID>"),  # CodeLlama (HF tokenizer.json)
    ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),  # CodeGeeX / GLM
)


class FimTokens(NamedTuple):
    """The fill-in-the-middle ids of a vocabulary, and where they were found (a metadata key or the pieces)."""

    prefix: int
    suffix: int
    middle: int
    source: str

    def prompt(self, prefix: list[int], suffix: list[int], bos: int | None = None) -> list[int]:
        """PSM order: ``[BOS] <PRE> prefix <SUF> suffix <MID>`` (llama.cpp's infill prompt)."""
        head = [] if bos is None else [bos]
        return [*head, self.prefix, *prefix, self.suffix, *suffix, self.middle]


def metadata_ids(meta: Mapping[str, Any], vocab_size: int) -> FimTokens | None:
    """The ids the GGUF metadata names (a whole triple of one key family, each an id of the vocabulary)."""
    for names in META_KEYS:
        keys = [f"tokenizer.ggml.{n}_token_id" for n in names]
        values = [meta.get(k) for k in keys]
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) and 0 <= int(v) < vocab_size
               for v in values):
            pre, suf, mid = (int(v) for v in values)  # type: ignore[arg-type]
            return FimTokens(pre, suf, mid, "gguf " + "/".join(keys))
    return None


def vocabulary_ids(token_to_id: Callable[[str], int | None]) -> FimTokens | None:
    """The first family of :data:`PIECES` whose three pieces are all in the vocabulary."""
    for pieces in PIECES:
        ids = [token_to_id(p) for p in pieces]
        if all(i is not None for i in ids):
            pre, suf, mid = (int(i) for i in ids if i is not None)
            return FimTokens(pre, suf, mid, "vocabulary " + " ".join(pieces))
    return None


__all__ = ["META_KEYS", "PIECES", "FimTokens", "metadata_ids", "vocabulary_ids"]
