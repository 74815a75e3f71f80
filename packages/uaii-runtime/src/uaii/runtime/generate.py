"""The text side of generation: streamed pieces, stop strings, and the sampler adapter of the decode loop.

:class:`TextStream` turns token ids into text pieces with the tokenizer's StreamDecoder and holds back the tail that
could still begin a stop string, so a stop string never reaches the caller, streamed or not. Only a tail that *is* the
beginning of some stop string waits (llama.cpp's find_partial_stop_string): with ``stop=["\nObservation:"]`` text
flows token by token and only a ``"\n"``, ``"\nObs"``, … waits for what follows. :func:`make_sampler`
picks the token of each step: an argmax for greedy decoding, else a :class:`~uaii.runtime.sampling.Sampler`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class TextStream:
    """Text of the generated ids, piece by piece, cut at the first stop string."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._decoder = tokenizer.stream() if tokenizer is not None else None
        self._stop = [s for s in stop if s]
        self._window = max((len(s) for s in self._stop), default=1) - 1  # released text a stop may still span
        self._pending = ""  # decoded but not yet released
        self.text = ""  # released so far
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Feed one generated id; return the text now safe to show ('' while held back)."""
        if self._decoder is None or self.stopped:
            return ""
        self._pending += self._decoder.step(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """End of generation: flush what the decoder and the stop-string window held back."""
        if self._decoder is not None and not self.stopped:
            self._pending += self._decoder.finish()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped:
            return ""
        if self._stop:
            window = self.text[-self._window:] if self._window else ""
            joined = window + self._pending
            hits = [i for i in (joined.find(s) for s in self._stop) if i >= 0]
            if hits:
                cut = min(hits) - len(window)
                piece = self._pending[:max(cut, 0)]
                self.text += piece
                self._pending = ""
                self.stopped = True
                return piece
            if not final:
                keep = min(partial_stop(joined, self._stop), len(self._pending))
                piece = self._pending[:len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep:]
                self.text += piece
                return piece
        piece, self._pending = self._pending, ""
        self.text += piece
        return piece


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``stops`` (0: none): the tail
    that must wait for the next piece because it may still grow into a stop string. A tail that cannot is released
    at once, however long the stop strings are."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class _Greedy:
    wants_history = False

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return int(np.argmax(logits))


class _Sampled:
    def __init__(self, sampler: Any, wants_history: bool) -> None:
        self.sampler = sampler
        self.wants_history = wants_history

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        return int(self.sampler.sample(logits, history))


def make_sampler(params: Any) -> Any:
    """``sampler(logits, history) -> token``; ``sampler.wants_history`` says whether it reads the tokens so far
    (a repetition penalty), so the loop builds that list only when needed."""
    if params is None:
        return _Greedy()
    from uaii.runtime.sampling import Sampler

    greedy = getattr(params, "greedy", False) and getattr(params, "repetition_penalty", 1.0) == 1.0
    if greedy:
        return _Greedy()
    return _Sampled(Sampler(params), getattr(params, "repetition_penalty", 1.0) != 1.0)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


__all__ = ["TextStream", "common_prefix", "make_sampler", "partial_stop"]
