"""Upper bounds for the counts a model header or config declares, checked before anything is sized by them.

A count that drives a loop or an allocation (layers, experts, context positions) is first compared with the
tensors that can confirm it (:mod:`uaii.loaders.gguf_counts`); these bounds are the backstop for what no tensor
confirms (a decoder's context length) and for callers that normalize metadata without a tensor table
(:func:`uaii.loaders.from_gguf`). One flipped bit in Gemma-3's ``block_count`` (18 -> 2^26 + 18) made the
per-layer tables of the config take 69 s and 600 MB before the builder noticed the missing layer. Every bound
is far above any published model, so only a corrupt value can reach it.
"""

from __future__ import annotations

from .errors import LoaderError

MAX_LAYERS = 1 << 12  # the deepest published LLMs have fewer than 200 layers
MAX_EXPERTS = 1 << 12  # DeepSeek-V3 has 256 routed experts, Kimi K2 384
MAX_CONTEXT = 1 << 24  # 16M positions; the longest published context is 10M (Llama 4 Scout)


def check_count(value: int, limit: int, key: str, where: str) -> int:
    """``value`` when it is at most ``limit``; else a LoaderError naming the file, the key and the value."""
    if value > limit:
        raise LoaderError(f"{where}: {key} is {value}, more than the {limit} that any model has: the value is "
                          "corrupt")
    return value


__all__ = ["MAX_CONTEXT", "MAX_EXPERTS", "MAX_LAYERS", "check_count"]
