"""The conformance suite on the webgpu backend (lavapipe in CI): every case of every op the backend lowers passes
against the reference evaluator within the case's tolerance."""

from __future__ import annotations

import pytest

from uaii.backends.testing import Case, cases, run_case

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend  # noqa: E402

GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
needs_adapter = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")


@needs_adapter
@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_case(case: Case) -> None:
    if not GPU.supports_op(case.graph.nodes[0]):
        pytest.fail(f"the webgpu backend does not lower {case.op}: {GPU.unsupported_reason(case.graph.nodes[0])}")
    result = run_case(GPU, case)
    assert result.ok, result


@needs_adapter
def test_the_webgpu_backend_lowers_every_registered_op_and_passes_the_whole_suite() -> None:
    from uaii.backends.testing import run_conformance
    from uaii.ir.registry import default_registry

    report = run_conformance(GPU)
    assert report.ok, report.summary()
    assert report.skipped == {} and report.uncovered == []
    assert report.ops == {s.op for s in default_registry().schemas()}
