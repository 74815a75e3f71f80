"""The conformance suite on the cuda backend, run on the host model of a device — with the kernels' references and
with their CUDA source built by the host compiler — and on a CUDA device where one exists: every case of an op the
backend lowers either passes against the reference evaluator within the case's tolerance or is refused at compile
time with a BackendError naming the node and the form it does not run (an activation times an activation, integer
arithmetic, a non-contiguous Slice, an attention mask input) — never a wrong number. Ops it does not lower at all
are refused by name (UnsupportedOpError)."""

from __future__ import annotations

from typing import Any

import pytest

from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.device import first_device
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.lower import OPS
from uaii.backends.testing import Case, cases, run_case

REFUSED = "BackendError: [backend] cuda: node "


@pytest.fixture(scope="module", params=["host", "compiled", "cuda"])
def backend(request: pytest.FixtureRequest) -> Any:
    """The host model with the references, with every kernel's CUDA source built for the host, or a device."""
    dev = {"host": HostDevice, "compiled": lambda: HostDevice(kernels="all"), "cuda": first_device}[request.param]()
    if dev is None:
        pytest.skip("no CUDA device")
    yield CudaBackend(device=dev)
    dev.close()


@pytest.mark.parametrize("case", [c for c in cases() if c.op in OPS], ids=lambda c: c.id)
def test_case_passes_or_is_refused_by_name(case: Case, backend: Any) -> None:
    result = run_case(backend, case)
    if not result.ok and result.message.startswith(REFUSED):
        pytest.skip(f"refused: {result.message[len('BackendError: '):]}")
    assert result.ok, result


def test_the_lowered_forms_cover_the_decoder_models() -> None:
    """What the decoder families need passes on the host model: 109 of the 123 cases of the lowered ops (2026-12-03;
    a count that only grows)."""
    backend = CudaBackend(device=HostDevice())
    passed = {c.id for c in cases() if c.op in OPS and run_case(backend, c).ok}
    assert len(passed) >= 109, sorted(passed)
    for op in ("Embedding", "RMSNorm", "AddRMSNorm", "LayerNorm", "GroupedMatMul", "SwiGLU", "GeGLU", "Reshape",
               "Split", "MoERouter", "MoEExperts", "RoPE"):
        assert any(p.startswith(f"{op}/") for p in passed), op


def test_ops_it_does_not_lower_are_refused_by_name() -> None:
    from uaii.backends.base import ArrayWeights, UnsupportedOpError

    backend = CudaBackend(device=HostDevice())
    case = next(c for c in cases() if c.op not in OPS)
    with pytest.raises(UnsupportedOpError, match=case.graph.nodes[0].name):
        backend.compile(case.graph, None, ArrayWeights(case.weights))
