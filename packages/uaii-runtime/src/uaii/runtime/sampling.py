"""Token sampling: :class:`SamplingParams` (what to do) and :class:`Sampler` (doing it, with its own RNG).

The order of operations is Hugging Face's (and llama.cpp's, but for where the temperature goes):

1. repetition penalty, HF style: every id in ``history`` has its logit divided by the penalty when positive and
   multiplied by it when negative;
2. temperature: ``0`` is greedy decoding, the exact argmax (the first maximum) of the penalized logits;
3. top-k: the ``top_k`` largest logits survive (``0`` = off);
4. top-p (nucleus): the smallest set of the most probable tokens whose probability reaches ``top_p`` survives;
5. min-p: tokens with probability below ``min_p`` times the largest survive not;
6. a draw from the surviving distribution with the sampler's ``numpy.random.Generator`` — the same seed gives
   the same tokens.

Large vocabularies (Gemma's 262,144 ids) are handled without sorting them: top-k uses ``argpartition``, and top-p
sorts only the head of the distribution once it is known to hold ``top_p`` of the mass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from uaii.ir import UaiiError

# top-p without top-k first looks at this many of the most probable tokens; it sorts everything only when they
# hold less than top_p of the probability mass.
_NUCLEUS_HEADS = (1024, 16384)


class SamplingError(UaiiError):
    """Invalid sampling parameters, or logits that admit no draw (NaN, all -inf)."""

    component = "sampling"


def _check_real(name: str, value: object, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SamplingError(f"{name} must be a finite number, found {value!r}")
    low_ok = value > lo if lo_open else value >= lo
    if not low_ok or value > hi:
        bracket = "(" if lo_open else "["
        raise SamplingError(f"{name} must be in {bracket}{lo:g}, {hi:g}], found {value!r}")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. The defaults are greedy decoding; every filter starts switched off.

    temperature: 0 = greedy (argmax); otherwise logits are divided by it (> 0).
    top_k: keep the k most likely tokens (0 = off).
    top_p: keep the smallest set of tokens whose probability reaches top_p, in (0, 1] (1 = off).
    min_p: keep tokens whose probability is at least min_p times the top token's, in [0, 1] (0 = off).
    repetition_penalty: > 0; 1 = off; > 1 discourages the ids in the history (prompt and generated tokens).
    seed: seed of the sampler's random generator (None = fresh entropy); the same seed gives the same tokens.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "temperature", _check_real("temperature", self.temperature, 0.0, math.inf))
        set_(self, "top_p", _check_real("top_p", self.top_p, 0.0, 1.0, lo_open=True))
        set_(self, "min_p", _check_real("min_p", self.min_p, 0.0, 1.0))
        set_(self, "repetition_penalty",
             _check_real("repetition_penalty", self.repetition_penalty, 0.0, math.inf, lo_open=True))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int | np.integer) or self.top_k < 0:
            raise SamplingError(f"top_k must be an int >= 0 (0 = off), found {self.top_k!r}")
        set_(self, "top_k", int(self.top_k))
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer) or self.seed < 0:
                raise SamplingError(f"seed must be an int >= 0 or None, found {self.seed!r}")
            set_(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


GREEDY = SamplingParams()


class Sampler:
    """Chooses token ids from logits according to :class:`SamplingParams`; owns its random generator.

    ``sample(logits, history)`` never modifies ``logits``. One sampler serves one generation stream: its
    generator advances with every draw, so two samplers made with the same seed produce the same ids.
    """

    def __init__(self, params: SamplingParams | None = None) -> None:
        self.params = params if params is not None else GREEDY
        self.rng = np.random.default_rng(self.params.seed)
        self._work: np.ndarray | None = None  # penalized copy of the logits, reused between calls

    def reseed(self, seed: int | None) -> None:
        """Restart the random generator (``None``: fresh entropy)."""
        self.rng = np.random.default_rng(seed)

    # ------------------------------------------------------------------------------------------------ the steps
    def penalized(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """``logits`` after the repetition penalty (``logits`` itself when there is nothing to penalize)."""
        x = _as_logits(logits)
        penalty = self.params.repetition_penalty
        if penalty == 1.0 or len(history) == 0:
            return x
        ids = np.unique(np.asarray(history, dtype=np.int64))
        ids = ids[(ids >= 0) & (ids < x.shape[0])]
        if self._work is None or self._work.shape != x.shape:
            self._work = np.empty_like(x)
        work = self._work
        np.copyto(work, x)
        vals = work[ids]
        work[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
        return work

    def candidates(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The ids that survive every filter and their renormalized probabilities.

        They are sorted most probable first when top-k or top-p is on (otherwise in id order). Greedy decoding
        gives one id with probability 1.
        """
        x = self.penalized(logits, history)
        top = float(x.max())
        if not math.isfinite(top):
            raise SamplingError("logits contain NaN" if math.isnan(top) else f"logits reach {top}")
        if self.params.greedy:
            return np.array([int(np.argmax(x))], dtype=np.int64), np.ones(1)
        ids, probs, is_sorted = self._softmax_top_k(x, top)
        ids, probs = self._top_p(ids, probs, is_sorted)
        probs = probs / probs.sum()
        floor = self.params.min_p * probs.max()
        if floor > 0.0 or probs.min() == 0.0:  # min-p, and ids whose probability underflowed to 0
            keep = probs >= floor if floor > 0.0 else probs > 0.0
            ids, probs = ids[keep], probs[keep]
            probs = probs / probs.sum()
        return ids, probs

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id."""
        if self.params.greedy:
            x = self.penalized(logits, history)
            i = int(np.argmax(x))  # the first maximum; NaN, if any, is found first
            v = float(x[i])
            if math.isnan(v) or v == -math.inf:
                raise SamplingError("logits contain NaN" if math.isnan(v) else "every logit is -inf")
            return i
        ids, probs = self.candidates(logits, history)
        cdf = np.cumsum(probs)
        pick = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(ids[min(pick, len(ids) - 1)])

    # ---------------------------------------------------------------------------------------------- internals
    def _softmax_top_k(self, x: np.ndarray, top: float) -> tuple[np.ndarray, np.ndarray, bool]:
        """Ids after top-k, their unnormalized probabilities at the temperature (float64, the largest is 1),
        and whether they are already sorted most probable first (top-k sorts its k ids; without top-k every id
        is a candidate and sorting is left to :meth:`_top_p`, which may need only the head)."""
        n = x.shape[0]
        k = self.params.top_k
        inv_t = 1.0 / self.params.temperature
        if 0 < k < n:
            ids = np.argpartition(x, n - k)[n - k:]
            ids = ids[np.argsort(-x[ids], kind="stable")].astype(np.int64, copy=False)
            return ids, np.exp((x[ids].astype(np.float64) - top) * inv_t), True
        probs = np.exp((x.astype(np.float64) - top) * inv_t)
        return np.arange(n, dtype=np.int64), probs, False

    def _top_p(self, ids: np.ndarray, probs: np.ndarray, is_sorted: bool) -> tuple[np.ndarray, np.ndarray]:
        """Keep the nucleus: the shortest most-probable head whose mass reaches top_p (off at 1: no sorting)."""
        p = self.params.top_p
        if p >= 1.0:
            return ids, probs
        total = float(probs.sum())
        if not is_sorted:
            n = probs.shape[0]
            order = None
            for head_size in _NUCLEUS_HEADS:  # enough mass in the head: no need to sort the whole vocabulary
                if n <= head_size:
                    break
                head = np.argpartition(probs, n - head_size)[n - head_size:]
                if float(probs[head].sum()) >= p * total:
                    order = head[np.argsort(-probs[head], kind="stable")]
                    break
            if order is None:
                order = np.argsort(-probs, kind="stable")
            ids, probs = ids[order], probs[order]
        m = int(np.searchsorted(np.cumsum(probs), p * total, side="left")) + 1
        m = min(m, probs.shape[0])
        return ids[:m], probs[:m]


def _as_logits(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits)
    if x.ndim != 1:
        if x.ndim == 2 and x.shape[0] == 1:
            return x[0]
        raise SamplingError(f"logits must have shape (vocab,), found {x.shape}")
    if x.shape[0] == 0:
        raise SamplingError("logits are empty")
    return x


__all__ = ["GREEDY", "Sampler", "SamplingError", "SamplingParams"]
