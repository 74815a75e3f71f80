"""One pipeline stage in the process it runs in: its layers' graph, planned and compiled under its own budget.

A stage loads the model file itself (on its own node: the file must be there, at the path the driver gives), cuts
the same graph the Session would run (:func:`uaii.runtime.rewrite.last_token_logits`, then
:func:`uaii.planner.pipeline.split_graph`) and keeps only its part: the storage planner pins what its budget holds
and streams the rest, exactly as for a whole model. Its KV states stay here; the driver names them by number. The
options are resolved here too, so a preset such as ``auto`` sizes the budget from this node's memory.

Nothing here knows about Ray: a :class:`StageRunner` is a plain object, which ``transport.py`` either calls in the
driver's process or wraps as a Ray actor.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from uaii.runtime.bounds import ContextBounds
from uaii.runtime.budget import bytes_per_token, check_memory, storage_stats
from uaii.runtime.build import Built, build_executable
from uaii.runtime.capabilities import check_backend, kv_state_options
from uaii.runtime.errors import SessionError
from uaii.runtime.model import load_bundle
from uaii.runtime.options import SessionOptions
from uaii.runtime.pipeline.plan import held_and_streamed
from uaii.runtime.planning import kv_slots, replan, session_plan
from uaii.runtime.rewrite import last_token_logits


class StageRunner:
    """See the module docstring. ``options``: Session keyword options for this stage (its budget among them)."""

    def __init__(self, model: str, options: Mapping[str, Any]) -> None:
        from uaii.backends import select_device

        self.options = SessionOptions.from_kwargs(dict(options))
        self._bundle = b = load_bundle(model)
        if not b.generative:
            raise SessionError(f"[runtime] {b.path.name} is not a decoder LM with a KV cache: only those run as "
                               "pipeline stages")
        self.backend = select_device(self.options.device)
        check_backend(self.backend, self.options, generative=True, model=b.path.name)
        if self.options.n_threads is not None:
            self.backend.set_threads(self.options.n_threads)
        self.bounds, self.options = ContextBounds.of(b, self.options)
        self.graph = last_token_logits(b.graph)
        self.stage: Any = None
        self.plan: Any = None
        self._built: Built | None = None
        self._states: dict[int, Any] = {}
        self._next_id = 1
        self.kv_bytes = 0  # one sequence's KV state here, at capacity
        self.busy_s = 0.0  # time in forward passes
        self.passes = 0

    # --- what the driver asks before and while it builds ----------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """This stage's node and budget, before any split: what the driver chooses the split from."""
        from uaii.planner import layer_cuts

        return {"host": socket.gethostname(), "pid": os.getpid(), "budget_bytes": self.options.budget_bytes,
                "context": self.bounds.context, "layers": len(layer_cuts(self.graph)) + 1}

    def ping(self) -> int:
        """An answer as soon as this stage is free: the driver's check for a stage that stopped answering."""
        return os.getpid()

    def build(self, starts: Sequence[int], index: int) -> dict[str, Any]:
        """Plan and compile stage ``index`` of the split beginning at layers ``starts``; its summary."""
        from uaii.planner import split_graph

        if self._built is not None:
            raise SessionError("[runtime] this pipeline stage is built already")
        self.stage = stage = split_graph(self.graph, starts)[index]
        o, context = self.options, self.bounds.context
        self.plan, _ = session_plan(stage.graph, self._bundle, o, backend=self.backend, context=context,
                                    budget=o.budget_bytes, cached=True)
        unplanned = self._compile()
        if unplanned:  # the backend allocates bytes the plan does not count: plan once more without them
            self._close_built()
            self.plan, _ = replan(stage.graph, self._bundle, o, backend=self.backend, context=context,
                                  unplanned=unplanned)
            self._compile(final=True)
        return self.summary()

    def _compile(self, final: bool = False) -> int:
        o = self.options
        slots = kv_slots(o, self.bounds.context)
        self._built = built = build_executable(self.stage.graph, self.plan, self._bundle, o, self.backend,
                                               kv_slots=slots, cached=True)
        probe = self.new_state()  # a sequence's state, to hold it to the budget with the rest; then freed
        state = self._states[probe]
        self.kv_bytes = int(state.nbytes)
        try:
            return check_memory(self.backend, built.exe, state, o, self.plan, enforced=bool(built.stream_kw),
                                final=final)
        finally:
            self.release(probe)

    def summary(self) -> dict[str, Any]:
        """The stage's layers, weights and what one token reads and moves (see PipelineInfo)."""
        st, built = self.stage, self._require()
        storage = getattr(self.plan, "storage", None) if built.stream_kw else None
        held, streamed = held_and_streamed(storage, st.weight_bytes)
        mem = built.exe.memory()
        return {"index": st.index, "first": st.first, "last": st.last, "host": socket.gethostname(),
                "budget_bytes": self.options.budget_bytes, "weight_bytes": st.weight_bytes,
                "mode": "streaming" if storage is not None else "mmap",
                "pinned_bytes": held, "streamed_bytes_per_token": streamed,
                "bytes_per_token": bytes_per_token(st.graph, self._bundle.locations, self.plan),
                "kv_bytes": self.kv_bytes, "arena_bytes": mem.arena_bytes,
                "receives": list(st.receives), "sends": list(st.sends)}

    # --- KV states ---------------------------------------------------------------------------------------------
    def _require(self) -> Built:
        if self._built is None:
            raise SessionError("[runtime] this pipeline stage is not built (or closed)")
        return self._built

    def _new_state(self) -> Any:
        context = self.bounds.context
        state = self._require().exe.new_state(context, **kv_state_options(self.options, context))
        self._states[self._next_id] = state
        self._next_id += 1
        return state

    def new_state(self) -> int:
        """A KV state for one more sequence; its number."""
        self._new_state()
        return self._next_id - 1

    def _state(self, sid: int) -> Any:
        try:
            return self._states[sid]
        except KeyError:
            raise SessionError(f"[runtime] pipeline stage {self.stage.index}: no KV state {sid}") from None

    def release(self, sid: int) -> None:
        self._states.pop(sid, None)

    def length(self, sid: int) -> int:
        return int(self._state(sid).length)

    def truncate(self, sid: int, n: int) -> int:
        self._state(sid).truncate(n)
        return int(self._state(sid).length)

    def reset(self, sid: int) -> None:
        self._state(sid).reset()

    def reserve(self, sid: int, n: int) -> int:
        return int(self._state(sid).reserve(n))

    # --- the forward pass -------------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray], previous: Mapping[str, Any] | None, sid: int) -> dict[str, Any]:
        """This stage's part of one forward pass on state ``sid``: ``feeds`` are the model's inputs (tokens,
        positions), ``previous`` the previous stage's reply (None in the first). The reply: ``values``, what the
        next stage takes (those made here and those passed on; in the last stage the logits), copies, as they
        leave the process; ``lengths``, every stage's KV length so far (the driver checks they agree)."""
        built, st = self._require(), self.stage
        carried: Mapping[str, np.ndarray] = previous["values"] if previous else {}
        missing = [v for v in (*st.receives, *st.forwards) if v not in carried]
        if missing:
            raise SessionError(f"[runtime] pipeline stage {st.index} did not receive {', '.join(missing)} from the "
                               "stage before it")
        ins = {x: feeds[x] for x in st.graph.inputs if x in feeds}
        ins.update({v: carried[v] for v in st.receives})
        state = self._state(sid)
        t0 = time.perf_counter()
        if built.stream_kw:
            built.store.begin_token()
        try:
            out = built.exe.run(ins, state)
        finally:
            if built.stream_kw:
                built.store.end_token()
            self.busy_s += time.perf_counter() - t0
            self.passes += 1
        values = {k: np.array(v) for k, v in out.items()}
        values.update({v: carried[v] for v in st.forwards})
        lengths = [*(previous["lengths"] if previous else ()), int(state.length)]
        return {"values": values, "lengths": lengths}

    def stats(self) -> dict[str, Any]:
        """Passes run and the seconds they took here (the driver compares them with its wall time: the hops), and
        the KV states held."""
        built = self._built
        storage = storage_stats(built.store, self.plan, built.exe) if built is not None and built.stream_kw else {}
        return {"passes": self.passes, "busy_s": self.busy_s, "states": len(self._states), "storage": storage}

    # --- the end ---------------------------------------------------------------------------------------------
    def _close_built(self) -> None:
        built, self._built = self._built, None
        self._states.clear()
        if built is not None:
            for obj in (built.exe, built.store):
                if obj is not None:
                    obj.close()

    def close(self) -> None:
        self._close_built()


__all__ = ["StageRunner"]
