"""The stages, seen by the Session as one executable: ``run(feeds, state)`` passes the feeds through the stages in
order and returns the logits; a :class:`PipelineState` is one sequence's KV states, one per stage.

The Session needs nothing else of it: its history, its chunked prefill and its rule that a pass and its bookkeeping
happen together or not at all (``truncate`` on every stage after a failed pass) hold unchanged. Every reply carries
each stage's KV length; stages that disagree are a broken pipeline, said at once rather than decoded past.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.backends.base import ExecutableMemory
from uaii.runtime.errors import SessionError
from uaii.runtime.pipeline.transport import StageFailure


@dataclass(frozen=True)
class StageInfo:
    """One built stage, as it reported itself (:meth:`uaii.runtime.pipeline.stage.StageRunner.summary`)."""

    index: int
    first: int  # its layers: first .. last - 1
    last: int
    host: str
    budget_bytes: int
    weight_bytes: int  # the weights its layers read, each once
    mode: str  # "streaming" (a storage plan under its budget) or "mmap"
    pinned_bytes: int
    streamed_bytes_per_token: int  # what its plan reads from disk per token
    bytes_per_token: int  # weight bytes one token reads here (pinned or streamed)
    kv_bytes: int  # one sequence's KV state here, at capacity
    arena_bytes: int
    receives: tuple[str, ...]
    sends: tuple[str, ...]

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> StageInfo:
        return cls(**{**d, "receives": tuple(d["receives"]), "sends": tuple(d["sends"])})


class PipelineState:
    """One sequence's KV states on every stage (their numbers there). ``length``: the tokens they hold, as the last
    pass reported it; ``truncate``/``reset``/``reserve`` reach every stage."""

    def __init__(self, exe: PipelineExecutable, ids: Sequence[int], nbytes: int) -> None:
        self._exe, self.ids, self._nbytes = exe, list(ids), nbytes
        self._length = 0
        self.released = False

    @property
    def length(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes the stages' states hold at capacity, all together (on their nodes, not this one)."""
        return self._nbytes

    def reset(self) -> None:
        self._exe.stages.call("reset", [(i,) for i in self.ids])
        self._length = 0

    def truncate(self, n: int) -> None:
        lengths = self._exe.stages.call("truncate", [(i, n) for i in self.ids])
        self._length = self._exe.agreed(lengths, f"truncate to {n}")

    def reserve(self, n: int) -> int:
        firsts = self._exe.stages.call("reserve", [(i, n) for i in self.ids])
        return self._exe.agreed(firsts, f"reserve {n}")

    def release(self) -> None:
        """Free the stages' states (a sequence that ended); idempotent, quiet on a broken pipeline."""
        if self.released:
            return
        self.released = True
        with contextlib.suppress(StageFailure):
            self._exe.stages.call("release", [(i,) for i in self.ids])


class PipelineExecutable:
    """See the module docstring. ``stages``: a LocalStages or RayStages, built; ``infos``: their summaries."""

    input_names: tuple[str, ...] = ("tokens", "positions")
    output_names: tuple[str, ...] = ("logits",)

    def __init__(self, stages: Any, infos: Sequence[StageInfo]) -> None:
        self.stages, self.infos = stages, list(infos)

    def agreed(self, values: Sequence[int], what: str) -> int:
        """The one value every stage answered; a StageFailure when they differ (their KV states diverged)."""
        if len(set(values)) != 1:
            raise StageFailure(f"[runtime] pipeline stages disagree after {what}: {list(values)}; their KV states "
                               "no longer match: close this session and build a new one")
        return int(values[0])

    def new_state(self, capacity: int, **_: Any) -> PipelineState:
        """A KV state on every stage (each sized by its own options: ``capacity`` and the rest were given to the
        stages when they were built)."""
        ids = self.stages.call("new_state")
        return PipelineState(self, ids, sum(i.kv_bytes for i in self.infos))

    def run(self, feeds: Mapping[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]:
        if not isinstance(state, PipelineState):
            raise SessionError(f"[runtime] a pipeline runs one sequence's KV state per pass (batched decode is not "
                               f"supported across stages), found {type(state).__name__}")
        before = state.length
        try:
            reply = self.stages.chain({k: np.asarray(v) for k, v in feeds.items()}, state.ids)
        except StageFailure:
            raise
        except BaseException:  # a stage refused the pass after the ones before it ran: every stage back to before
            state.truncate(before)
            raise
        state._length = self.agreed(reply["lengths"], "a forward pass")
        return {"logits": reply["values"]["logits"]}

    def memory(self) -> ExecutableMemory:
        """Nothing of this process's memory: the stages hold their weights, arenas and KV states on their nodes
        (``device="pipeline"``, never counted against this host's budget)."""
        return ExecutableMemory(arena_bytes=sum(i.arena_bytes for i in self.infos),
                                weight_bytes=sum(i.pinned_bytes for i in self.infos), device="pipeline")

    def stats(self) -> list[dict[str, Any]]:
        """Each stage's passes and busy seconds (and its storage telemetry when it streams)."""
        return list(self.stages.call("stats"))

    def close(self) -> None:
        self.stages.close()


__all__ = ["PipelineExecutable", "PipelineState", "StageInfo"]
