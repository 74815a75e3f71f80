"""The conformance suite on the cuda backend, run on the host model of a device — with the kernels' references and
with their CUDA source built by the host compiler — and on a CUDA device where one exists: every case of an op the
backend lowers either passes against the reference evaluator within the case's tolerance or is refused at compile
time with a BackendError naming the node and the form it does not run (an activation times an activation, integer
arithmetic, a non-contiguous Slice, sink tokens in a bidirectional window) — never a wrong number. Ops it does not
lower at all are refused by name (UnsupportedOpError)."""

from __future__ import annotations

from typing import Any

import pytest

from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.device import first_device
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.lower import OPS
from uaii.backends.testing import Case, cases, run_case

REFUSED = ("BackendError: [backend] cuda: node ", "BackendError: [backend] cuda: input ")


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


def test_the_lowered_forms_cover_the_suite() -> None:
    """Every case passes on the host model but three, refused by name (2026-12-03; a count that only grows): a
    Gather from a block-quantized table, and i64 values beyond the device's 32-bit words (a constant and a feed)."""
    backend = CudaBackend(device=HostDevice())
    results = [run_case(backend, c) for c in cases() if c.op in OPS]
    passed = {r.case for r in results if r.ok}
    assert len(passed) >= 348, sorted(r.case for r in results if not r.ok)
    assert all(r.ok or r.message.startswith(REFUSED) for r in results)


def test_it_lowers_every_op_the_cpu_backend_runs() -> None:
    """The issue's "kernels for the same op set as the CPU backend"."""
    from uaii.backends.cpu.backend import CpuBackend

    assert CpuBackend().capabilities.ops <= CudaBackend(device=HostDevice()).capabilities.ops


def test_ops_it_does_not_lower_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op outside Capabilities.ops (as a plugin's op would be) is refused at compile time naming the node."""
    from uaii.backends.base import ArrayWeights, UnsupportedOpError
    from uaii.backends.cuda import lower

    monkeypatch.setattr(lower, "OPS", lower.OPS - {"Softmax"})
    backend = CudaBackend(device=HostDevice())
    case = next(c for c in cases() if c.op == "Softmax")
    with pytest.raises(UnsupportedOpError, match=case.graph.nodes[0].name):
        backend.compile(case.graph, None, ArrayWeights(case.weights))
