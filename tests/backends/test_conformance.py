"""The conformance suite on the CPU backend: every case passes, every registered op has cases and is supported (or
listed as unsupported with a reason), and the suite catches a backend that computes something else."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from uaii.backends import CpuBackend, get_backend
from uaii.backends.testing import Case, cases, run_case, run_conformance
from uaii.ir import Node
from uaii.ir.registry import default_registry

CPU = get_backend("cpu")


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_case(case: Case) -> None:
    result = run_case(CPU, case)
    assert result.ok, result


def test_the_cpu_backend_passes_the_whole_suite() -> None:
    report = run_conformance(CPU)
    assert report.ok, report.summary()
    assert report.skipped == {} and report.uncovered == []
    assert report.ops == {s.op for s in default_registry().schemas()}


def test_every_registered_op_is_supported_or_listed_with_a_reason() -> None:
    caps = CPU.capabilities
    for schema in default_registry().schemas():
        node = Node(f"probe/{schema.op}", schema.op, ("x",), ("y",))
        if CPU.supports_op(node):
            continue
        reason = caps.unsupported.get(schema.op)
        assert reason, f"{schema.op} is neither supported by the cpu backend nor listed as unsupported"


def test_every_registered_op_has_cases_with_decode_and_prefill_shapes() -> None:
    ops = {c.op for c in cases()}
    assert ops == {s.op for s in default_registry().schemas()}
    quantized = {c.op for c in cases() if any(w.dtype == np.uint8 for w in c.weights.values())}
    assert {"MatMul", "GroupedMatMul", "Embedding", "MoEExperts"} <= quantized


class _OffByOne(CpuBackend):
    """A backend whose Add is wrong: the suite must notice."""

    name = "off-by-one"

    def compile(self, graph: Any, plan: Any, weights: Any, **options: Any) -> Any:
        exe = super().compile(graph, plan, weights, **options)
        if graph.nodes[0].op != "Add":
            return exe
        run = exe.run

        def wrong(feeds: Any, state: Any = None) -> dict[str, np.ndarray]:
            return {k: v + 1 for k, v in run(feeds, state).items()}

        exe.run = wrong  # type: ignore[method-assign]
        return exe


class _NoTopK(CpuBackend):
    name = "no-topk"

    def unsupported_reason(self, node: Node) -> str | None:
        return "not yet" if node.op == "TopK" else super().unsupported_reason(node)


def test_a_wrong_backend_fails_and_an_unsupported_op_is_skipped_with_its_reason() -> None:
    report = run_conformance(_OffByOne(), ops=["Add", "Mul"])
    assert not report.ok and {r.op for r in report.failures} == {"Add"}
    assert "Add/" in report.summary()
    skipped = run_conformance(_NoTopK(), ops=["TopK", "ArgMax"])
    assert skipped.ok and skipped.skipped == {"TopK": "not yet"} and skipped.ops == {"ArgMax"}
