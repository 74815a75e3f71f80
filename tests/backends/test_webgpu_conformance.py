"""The conformance suite on the webgpu backend (lavapipe in CI): every case of every op the backend lowers passes
against the reference evaluator within the case's tolerance."""

from __future__ import annotations

import pytest

from uaii.backends.testing import Case, cases, run_case

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend  # noqa: E402
from uaii.backends.webgpu.backend import UNSUPPORTED  # noqa: E402
from uaii.ir import Node  # noqa: E402

GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
needs_adapter = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")


@needs_adapter
@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_case(case: Case) -> None:
    node = case.graph.nodes[0]
    if not GPU.supports_op(node):
        if case.op in UNSUPPORTED:
            pytest.skip(f"declared unsupported by the webgpu backend: {UNSUPPORTED[case.op]}")
        pytest.fail(f"the webgpu backend does not lower {case.op}: {GPU.unsupported_reason(node)}")
    result = run_case(GPU, case)
    assert result.ok, result


@needs_adapter
def test_the_webgpu_backend_lowers_every_registered_op_it_does_not_declare_unsupported() -> None:
    from uaii.backends.testing import run_conformance
    from uaii.ir.registry import default_registry

    report = run_conformance(GPU)
    assert report.ok, report.summary()
    declared = dict(GPU.capabilities.unsupported)
    assert report.skipped == declared and report.uncovered == []
    assert report.ops == {s.op for s in default_registry().schemas()} - set(declared)


def test_every_declared_unsupported_op_is_registered_and_has_a_reason() -> None:
    from uaii.ir.registry import default_registry

    registered = {s.op for s in default_registry().schemas()}
    assert set(UNSUPPORTED) <= registered
    assert all(why.strip() for why in UNSUPPORTED.values())
    for op, why in UNSUPPORTED.items():
        assert GPU.unsupported_reason(Node(f"probe/{op}", op, ("x",), ("y",))) in (None, why)
