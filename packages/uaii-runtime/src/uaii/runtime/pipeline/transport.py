"""How the driver reaches its stages: in its own process (:class:`LocalStages`) or as Ray actors, one per node
(:class:`RayStages`).

Both offer the same three calls: ``call`` one method on every stage (each with its own arguments), ``chain`` a
forward pass through them in order, ``close``. On Ray a pass is one remote call per stage, each taking the previous
one's result by reference, so the hidden state goes from node to node without passing through the driver; only
the last stage's reply (the logits) comes back. Ray is imported only when a RayStages is made.

A stage that dies or does not answer within the timeout ends the pipeline: the pass raises a SessionError naming
the stage and its node, and every later call raises at once (the stages' KV states no longer agree: the session
must be rebuilt). Nothing waits forever.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from uaii.ir import UaiiError
from uaii.runtime.errors import SessionError
from uaii.runtime.pipeline.stage import StageRunner
from uaii.runtime.ray_support import import_ray

log = logging.getLogger("uaii.runtime")
RAY_HINT = "pip install 'uaii-runtime[ray]'"


class StageFailure(SessionError):
    """A pipeline stage died, timed out or failed: the pipeline cannot go on (rebuild the session)."""


class LocalStages:
    """Every stage in this process: the split, the per-stage plans and the hops' bookkeeping without a cluster (a
    split checked on one machine, the tests)."""

    def __init__(self, model: str | Path, options: Sequence[Mapping[str, Any]]) -> None:
        self.runners: list[StageRunner] = []
        try:
            for opts in options:
                self.runners.append(StageRunner(str(model), opts))
        except BaseException:
            self.close()
            raise
        self.hosts = ["local"] * len(self.runners)

    def __len__(self) -> int:
        return len(self.runners)

    def call(self, method: str, args: Sequence[tuple[Any, ...]] | None = None) -> list[Any]:
        args = args if args is not None else [()] * len(self.runners)
        return [getattr(r, method)(*a) for r, a in zip(self.runners, args, strict=True)]

    def chain(self, feeds: Mapping[str, Any], sids: Sequence[int]) -> dict[str, Any]:
        reply: dict[str, Any] | None = None
        for r, sid in zip(self.runners, sids, strict=True):
            reply = r.run(feeds, reply, sid)
        assert reply is not None
        return reply

    def close(self) -> None:
        for r in self.runners:
            r.close()
        self.runners = []


class RayStages:
    """One Ray actor per stage, each on its own node (a STRICT_SPREAD placement group of one ``{"CPU": cpus}``
    bundle per stage). ``address``: the cluster to join when this process is not connected to one yet (None: the
    one Ray finds, as ``ray.init()`` does). ``timeout_s``: the longest a call may take before the stage is
    declared lost."""

    def __init__(self, model: str | Path, options: Sequence[Mapping[str, Any]], *, address: str | None = None,
                 cpus: float = 1.0, timeout_s: float = 120.0) -> None:
        try:
            ray = import_ray()
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError as exc:
            raise SessionError(f"[runtime] pipeline stages on Ray need Ray ({exc.name} is not installed): "
                               f"{RAY_HINT}") from None
        self._ray, self.timeout_s = ray, timeout_s
        self._broken: str | None = None
        self.actors: list[Any] = []
        self.hosts: list[str] = ["its node"] * len(options)
        self.pg: Any = None
        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=False)
        k = len(options)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) < k:
            raise SessionError(f"[runtime] {k} pipeline stages run on {k} nodes, one each; the Ray cluster has "
                               f"{len(alive)} alive node{'s' if len(alive) != 1 else ''} (add nodes with `ray start "
                               "--address ...`, or run fewer stages)")
        self.pg = placement_group([{"CPU": cpus}] * k, strategy="STRICT_SPREAD")
        try:
            ray.get(self.pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise SessionError(f"[runtime] Ray could not place {k} pipeline stages of {cpus:g} CPU each on {k} "
                               f"different nodes within {timeout_s:g} s (alive nodes: {len(alive)}; free CPUs per "
                               "node decide it)") from None
        actor = ray.remote(StageRunner)
        try:
            self.actors = [
                actor.options(num_cpus=cpus, max_restarts=0, max_task_retries=0,
                              scheduling_strategy=PlacementGroupSchedulingStrategy(
                                  placement_group=self.pg, placement_group_bundle_index=i))
                .remote(str(model), opts)
                for i, opts in enumerate(options)]
            self.hosts = [h["host"] for h in self.call("describe")]
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.actors)

    def _check(self) -> None:
        if self._broken is not None:
            raise StageFailure(f"[runtime] the pipeline is broken ({self._broken}); close this session and build "
                               "a new one")

    def _get(self, refs: Any) -> Any:
        ray = self._ray
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            stuck = self._unresponsive()
            where = f"stage {', '.join(stuck)}" if stuck else "a stage"
            self._fail(f"{where} did not answer within {self.timeout_s:g} s")
        except ray.exceptions.RayActorError as exc:
            self._fail(f"stage {self._which(exc)} died ({type(exc).__name__}: {_first_line(exc)})")
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, UaiiError):  # a stage refused the call (a bad state number): not a lost stage
                raise cause from None
            self._fail(f"stage {self._which(exc)} failed: {_first_line(cause or exc)}")
        raise AssertionError("unreachable")

    def _unresponsive(self, wait_s: float = 2.0) -> list[str]:
        """The stages that do not answer a ping within ``wait_s`` (a stage runs one call at a time: the one stuck
        in a pass does not); each as "index (on host)"."""
        refs = [a.ping.remote() for a in self.actors]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        done = {r.hex() for r in ready}
        return [f"{i} (on {self.hosts[i]})" for i, r in enumerate(refs) if r.hex() not in done]

    def _which(self, exc: Exception) -> str:
        dead = getattr(exc, "actor_id", None)
        for i, a in enumerate(self.actors):
            if dead is not None and a._actor_id.hex() == dead:
                return f"{i} (on {self.hosts[i]})"
        return "?"

    def _fail(self, why: str) -> None:
        self._broken = why
        log.error("[runtime] pipeline: %s", why)
        raise StageFailure(f"[runtime] pipeline {why}; the pipeline cannot go on: close this session and build a "
                           "new one") from None

    def call(self, method: str, args: Sequence[tuple[Any, ...]] | None = None) -> list[Any]:
        self._check()
        args = args if args is not None else [()] * len(self.actors)
        refs = [getattr(a, method).remote(*x) for a, x in zip(self.actors, args, strict=True)]
        return list(self._get(refs))

    def chain(self, feeds: Mapping[str, Any], sids: Sequence[int]) -> dict[str, Any]:
        self._check()
        ref = None
        for a, sid in zip(self.actors, sids, strict=True):
            ref = a.run.remote(dict(feeds), ref, sid)  # a reference: Ray hands the value to the next actor
        return dict(self._get(ref))

    def close(self) -> None:
        ray = self._ray
        for a in self.actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)
        self.actors = []
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # the cluster is gone
                remove_placement_group(self.pg)
            self.pg = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = ["RAY_HINT", "LocalStages", "RayStages", "StageFailure"]
