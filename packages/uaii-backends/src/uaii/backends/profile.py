"""Step profiles: where an executable's run spends its time, per node and per op family, kept by the executable
while profiling is on (:attr:`~uaii.backends.base.Capabilities.step_profile`).

A backend that declares ``step_profile`` has executables with ``set_profiling(on)`` and ``take_profile()``. While
on, each run times every step it executes and the whole run around them (feeding inputs, binding the state, the
loop itself); ``take_profile`` returns what was gathered since the last take, one :class:`StepProfile` per kind of
run (by the number of rows a run feeds: a decode step's 1, a prefill chunk's n), and starts afresh. Off, a run costs
what it did without this module: the executables check one attribute per run.

Why the run's own wall time beside the steps': their difference is what the executor costs between kernels (the
Python loop, ffi calls, feeds), which is what a C step runner would remove; the caller (``uaii bench --profile``)
adds the time outside ``run`` (sampling, detokenizing) from its own clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class NodeTiming:
    """One node's steps over the profiled runs: ``seconds`` of ``calls`` step calls; ``weight_bytes`` that one run
    of the node reads from its weights (0 where that is not the whole weight: embeddings, expert banks)."""

    node: str
    op: str
    family: str
    steps: int = 0
    calls: int = 0
    seconds: float = 0.0
    weight_bytes: int = 0


@dataclass
class FamilyTiming:
    """Nodes of one family (``gemm q4_1``, ``Attention``, ...) added together; ``weight_bytes`` per run."""

    family: str
    nodes: int = 0
    seconds: float = 0.0
    weight_bytes: int = 0


@dataclass
class StepProfile:
    """The profiled runs of one kind (``rows`` fed per run): their count, their wall time (run() entry to exit) and
    each node's steps. Seconds are totals over the ``runs``; the per-run figures divide by it."""

    rows: int
    runs: int = 0
    run_seconds: float = 0.0
    nodes: list[NodeTiming] = field(default_factory=list)

    @property
    def step_seconds(self) -> float:
        return sum(n.seconds for n in self.nodes)

    @property
    def executor_seconds(self) -> float:
        """Run time outside the steps: feeds, state binding, the loop that calls them."""
        return max(self.run_seconds - self.step_seconds, 0.0)

    @property
    def steps_per_run(self) -> int:
        return sum(n.steps for n in self.nodes)

    def families(self) -> list[FamilyTiming]:
        """Node timings summed by family, the costliest first."""
        by: dict[str, FamilyTiming] = {}
        for n in self.nodes:
            f = by.setdefault(n.family, FamilyTiming(n.family))
            f.nodes += 1
            f.seconds += n.seconds
            f.weight_bytes += n.weight_bytes
        return sorted(by.values(), key=lambda f: -f.seconds)


def merge_profiles(profiles: Iterable[StepProfile]) -> list[StepProfile]:
    """Profiles of the same ``rows`` added together (several executables of one session), nodes matched by name."""
    out: dict[int, StepProfile] = {}
    for p in profiles:
        into = out.get(p.rows)
        if into is None:
            out[p.rows] = StepProfile(p.rows, p.runs, p.run_seconds, [NodeTiming(**vars(n)) for n in p.nodes])
            continue
        into.runs += p.runs
        into.run_seconds += p.run_seconds
        index = {n.node: n for n in into.nodes}
        for n in p.nodes:
            have = index.get(n.node)
            if have is None:
                into.nodes.append(NodeTiming(**vars(n)))
            else:
                have.calls += n.calls
                have.seconds += n.seconds
    return sorted(out.values(), key=lambda p: p.rows)


__all__ = ["FamilyTiming", "NodeTiming", "StepProfile", "merge_profiles"]
