"""The conformance suite every backend must pass: each registered op on small random cases, against the NumPy
reference evaluator of uaii-ir (:func:`uaii.ir.reference.evaluate`), with stated tolerances.

    from uaii.backends import get_backend
    from uaii.backends.testing import run_conformance
    report = run_conformance(get_backend("cpu"))
    assert report.ok, report.summary()

A backend that does not run an op says so (``supports_op`` false, with ``unsupported_reason``); its cases are then
reported as skipped with that reason instead of failing. Ops of the registry without any case are listed in
``report.uncovered``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from uaii.backends.base import ArrayWeights
from uaii.backends.testing.cases import F32, LOW, Q8_ACT, Case
from uaii.backends.testing.suite import all_cases
from uaii.ir import DType
from uaii.ir.registry import default_registry


@dataclass(frozen=True)
class CaseResult:
    case: str
    op: str
    ok: bool
    error: float  # normalized max error (inf when the case raised)
    tol: float
    message: str = ""


@dataclass
class ConformanceReport:
    backend: str
    results: list[CaseResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # op -> reason the backend gave
    uncovered: list[str] = field(default_factory=list)  # registered ops without a case

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.ok]

    @property
    def ops(self) -> set[str]:
        return {r.op for r in self.results}

    def summary(self) -> str:
        lines = [f"conformance of {self.backend}: {len(self.results) - len(self.failures)}/{len(self.results)} "
                 f"cases pass over {len(self.ops)} ops; {len(self.skipped)} ops skipped"]
        lines += [f"  FAIL {r.case}: error {r.error:.3g} > tol {r.tol:g} {r.message}" for r in self.failures]
        lines += [f"  skip {op}: {why}" for op, why in sorted(self.skipped.items())]
        lines += [f"  no case: {op}" for op in self.uncovered]
        return "\n".join(lines)


def cases(ops: Iterable[str] | None = None) -> list[Case]:
    """The suite's cases, optionally only those of ``ops``."""
    wanted = set(ops) if ops is not None else None
    return [c for c in all_cases() if wanted is None or c.op in wanted]


def _compare(got: np.ndarray, ref: np.ndarray, dtype: DType) -> float:
    """Normalized max error; exact types give 0 or inf."""
    from uaii.backends.cpu.bind import to_f32
    from uaii.kernels import dequantize

    if dtype.is_quantized:
        got = dequantize(np.asarray(got).reshape(-1).view(np.uint8), dtype, ref.size).reshape(ref.shape)
    elif dtype is DType.BF16:
        got, ref = to_f32(got, dtype), to_f32(ref, dtype)
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return math.inf
    if got.dtype.kind in "iub" and ref.dtype.kind in "iub":
        return 0.0 if np.array_equal(got, ref) else math.inf
    g, r = got.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(r)):
        return math.inf
    finite = ~np.isnan(r)
    if not finite.any():
        return 0.0
    scale = max(float(np.max(np.abs(r[finite]))), 1e-6)
    return float(np.max(np.abs(g[finite] - r[finite]))) / scale


def run_case(backend: Any, case: Case) -> CaseResult:
    from uaii.ir.reference import evaluate

    graph = case.graph
    try:
        exe = backend.compile(graph, None, ArrayWeights(case.weights), kv_state=bool(case.feeds_seq))
        worst = 0.0
        if case.feeds_seq:
            state = exe.new_state(64)
            past = {n: np.zeros((0, *(int(d) for d in graph.tensor(n).shape[1:])), np.float32) for n in graph.inputs
                    if n.startswith("past_")}
            for feeds in case.feeds_seq:
                got = exe.run(feeds, state)
                ref = evaluate(graph, {**feeds, **past}, case.ref_weights)
                worst = max(worst, _compare(got["y"], ref["y"], DType.F32))
                past = {"past_k": ref["present_k"], "past_v": ref["present_v"]}
        else:
            got = exe.run(case.feeds)
            ref = evaluate(graph, case.feeds, case.ref_weights)
            for name in graph.outputs:
                worst = max(worst, _compare(got[name], ref[name], graph.tensor(name).dtype))
        exe.close()
    except Exception as exc:  # a case that raises fails with the reason, the suite goes on
        return CaseResult(case.id, case.op, False, math.inf, case.tol, f"{type(exc).__name__}: {exc}")
    return CaseResult(case.id, case.op, worst <= case.tol, worst, case.tol)


def run_conformance(backend: Any, ops: Iterable[str] | None = None) -> ConformanceReport:
    """Run every case (or those of ``ops``) on ``backend``; see :class:`ConformanceReport`."""
    report = ConformanceReport(getattr(backend, "name", repr(backend)))
    chosen = cases(ops)
    for case in chosen:
        node = case.graph.nodes[0]
        if not backend.supports_op(node):
            reason = getattr(backend, "unsupported_reason", lambda n: None)(node)
            report.skipped[node.op] = reason or "not supported"
            continue
        report.results.append(run_case(backend, case))
    covered = {c.op for c in all_cases()}
    wanted = set(ops) if ops is not None else None
    report.uncovered = sorted(s.op for s in default_registry().schemas()
                              if s.op not in covered and (wanted is None or s.op in wanted))
    return report


def greedy_steps(exe: Any, state: Any, prompt: Sequence[int]) -> Iterator[np.ndarray]:
    """The logits of ``prompt``, then of one greedy decode step after another for as long as the caller iterates:
    how a test or a benchmark drives a compiled language model (an Executable with ``tokens`` and ``positions``
    inputs and a ``logits`` output) and its KV state without a Session — the caller times or compares the steps."""
    first = state.reserve(len(prompt))
    logits = exe.run({"tokens": np.asarray(prompt), "positions": np.arange(first, first + len(prompt))},
                     state)["logits"]
    while True:
        yield logits
        token = int(np.argmax(logits[-1]))
        logits = exe.run({"tokens": np.array([token]), "positions": np.array([state.reserve(1)])}, state)["logits"]


__all__ = ["F32", "LOW", "Q8_ACT", "Case", "CaseResult", "ConformanceReport", "cases", "greedy_steps", "run_case",
           "run_conformance"]
