"""The device-memory budget (uaii.runtime.gpu_budget): which weights stay on a device backend and which stream,
by the planner's pinning rule, and how a Session passes the streamed ones to ``compile``.

The Session tests use a backend that declares device memory and records what ``compile`` is given (it runs on the
CPU); the last test runs the real webgpu backend (lavapipe in CI) under a budget smaller than the model."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.backends import Capabilities, CpuBackend, registry
from uaii.runtime import Session
from uaii.runtime.capabilities import check_backend
from uaii.runtime.errors import SessionError
from uaii.runtime.gpu_budget import DEVICE_FRACTION, device_budget, device_streaming, plan_residency
from uaii.runtime.model import load_bundle
from uaii.runtime.options import SessionOptions

KiB = 1 << 10
SMALL = {"max_batch": 8, "max_context": 32}  # a small arena and KV cache: the weights decide what fits


@pytest.fixture(scope="module")
def graph(tiny: Path) -> Any:
    return load_bundle(tiny).graph


def weight_refs(graph: Any) -> dict[str, Any]:
    return {str(t.weight): t for t in graph.weights if t.weight is not None}


def residency(graph: Any, budget: int, **kw: Any) -> Any:
    return plan_residency(graph, graph.nodes, backend="gpu", device_memory=1 << 30, budget_bytes=budget, **kw)


def test_everything_stays_on_a_device_that_holds_it(graph: Any) -> None:
    r = residency(graph, 1 << 30, arena_bytes=64 * KiB, kv_cache_bytes=16 * KiB)
    assert r.streamed == () and set(r.resident) == set(weight_refs(graph)) and r.staging_bytes == 0
    assert r.total_bytes == r.resident_bytes + 80 * KiB <= r.budget_bytes


def test_a_model_larger_than_the_budget_streams_pinned_first(graph: Any) -> None:
    refs = weight_refs(graph)
    total = sum(t.dtype.nbytes(int(np.prod(t.shape))) for t in refs.values())
    budget = total * 2 // 3
    r = residency(graph, budget)
    assert r.streamed and r.total_bytes <= budget and r.resident_bytes + r.streamed_bytes == total
    for ref in r.streamed:  # what streams: matrices of trunk layers; never a norm, the embeddings or lm_head
        t = refs[ref]
        assert len(t.shape) == 2 and ".layers." in ref, ref
    for ref, t in refs.items():
        if len(t.shape) == 1 or "embed_tokens" in ref or "lm_head" in ref:
            assert ref in r.resident, ref
    # the GPU stages a weight whole: the staging buffer holds the largest streamed weight, as the planner sizes it
    # for a read at any file offset (window_bytes: the pages it covers)
    from uaii.planner import window_bytes

    largest = max(refs[x].dtype.nbytes(int(np.prod(refs[x].shape))) for x in r.streamed)
    assert r.staging_bytes == window_bytes(largest) and largest <= r.staging_bytes < largest + 2 * 4096


def test_what_the_host_streams_streams_on_the_device_too(graph: Any) -> None:
    some = sorted(weight_refs(graph))[:2]
    r = residency(graph, 1 << 30, host_streamed=frozenset(some))
    assert set(r.streamed) == set(some) and not set(some) & set(r.resident)


def test_a_budget_below_the_smallest_device_plan_is_an_error(graph: Any) -> None:
    with pytest.raises(SessionError, match=r"device budget \(gpu_budget_bytes\) of 4096 bytes cannot hold the "
                                           r"smallest device plan: memory budget of 4096 bytes is too small.*"
                                           r"raise --gpu-budget"):
        residency(graph, 4096, arena_bytes=64 * KiB)


def test_the_default_budget_is_a_share_of_the_device_memory() -> None:
    assert device_budget(10_000) == int(10_000 * DEVICE_FRACTION) and device_budget(10_000, 1234) == 1234


class DeviceCpu(CpuBackend):
    """The CPU backend declaring device memory: ``compile`` records its options and runs on the CPU."""

    name = "fakegpu"
    kind = "gpu"

    def __init__(self, device_memory: int, streams: bool = True) -> None:
        super().__init__()
        self.device_memory = device_memory
        self.streams = streams
        self.seen: dict[str, Any] = {}

    @property
    def capabilities(self) -> Capabilities:
        return replace(super().capabilities, device_memory=self.device_memory, streams_weights=self.streams)

    def compile(self, graph: Any, plan: Any, weights: Any, **options: Any) -> Any:
        self.seen = dict(options)
        kept = {k: v for k, v in options.items() if k in ("max_tokens", "memory_reuse", "kv_state", "gemm")}
        return super().compile(graph, plan, weights, **kept)


@pytest.fixture
def fakegpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))

    def make(device_memory: int, streams: bool = True) -> DeviceCpu:
        backend = DeviceCpu(device_memory, streams)
        monkeypatch.setitem(registry._instances, "fakegpu", backend)
        return backend

    return make


def test_a_session_streams_what_the_device_budget_does_not_hold(tiny: Path, fakegpu: Any) -> None:
    backend = fakegpu(1 << 30)
    ids = [3, 9, 17, 4]
    with Session(tiny, device="fakegpu", **SMALL) as s:  # default budget: 80 % of 1 GiB holds the model
        full = s.device_residency
        assert full is not None and full.streamed == () and full.budget_bytes == int(DEVICE_FRACTION * (1 << 30))
        assert backend.seen["streamed"] == []
        want = s.forward(ids)
    budget = full.total_bytes - full.resident_bytes // 3
    with Session(tiny, device="fakegpu", gpu_budget_bytes=budget, **SMALL) as s:
        r = s.device_residency
        assert r is not None and r.budget_bytes == budget and r.streamed and r.total_bytes <= budget
        assert backend.seen["streamed"] == list(r.streamed)  # what compile was told to stream
        np.testing.assert_array_equal(s.forward(ids), want)


def test_a_device_budget_needs_a_device(tiny: Path, fakegpu: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Refused (named device) or warned about (auto) once, with the other options, before anything is planned:
    ``check_backend``; ``device_streaming`` leaves a host backend's streaming as it is, re-plan or not."""
    cpu = CpuBackend()
    with pytest.raises(SessionError, match="gpu_budget_bytes=1000: the cpu backend has no device memory"):
        check_backend(cpu, SessionOptions(device="cpu", gpu_budget_bytes=1000), generative=True, model="m")
    with caplog.at_level(logging.WARNING, logger="uaii.runtime"):
        check_backend(cpu, SessionOptions(device="auto", gpu_budget_bytes=1000), generative=True, model="m")
    assert caplog.text.count("does not apply: device auto chose cpu") == 1
    graph = load_bundle(tiny).graph
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="uaii.runtime"):
        res, kw = device_streaming(cpu, graph, None, SessionOptions(device="cpu", gpu_budget_bytes=1000), {"x": 1}, 0)
    assert res is None and kw == {"x": 1} and "gpu_budget_bytes" not in caplog.text
    with pytest.raises(SessionError, match="gpu_budget_bytes=1000: the cpu backend has no device memory"):
        Session(tiny, device="cpu", gpu_budget_bytes=1000, **SMALL)
    fakegpu(1 << 30, streams=False)
    with Session(tiny, device="fakegpu", **SMALL) as s:
        full = s.device_residency
    assert full is not None
    with pytest.raises(SessionError, match=r"weights stream.*but the fakegpu backend does not stream weights"):
        Session(tiny, device="fakegpu", gpu_budget_bytes=full.total_bytes - full.resident_bytes // 3, **SMALL)
    with pytest.raises(SessionError, match="gpu_budget_bytes must be an int >= 0"):
        SessionOptions(gpu_budget_bytes=-1)


def test_webgpu_runs_a_model_larger_than_its_budget(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    from uaii.backends.webgpu import WebGpuBackend

    status = WebGpuBackend(allow_software=True).probe()
    if not status.available:
        pytest.skip(f"no WebGPU adapter: {status.reason}")
    monkeypatch.setenv("UAII_ALLOW_SOFTWARE_GPU", "1")
    ids = [3, 9, 17, 4, 22]
    with Session(tiny, device="webgpu", plan_cache=False, **SMALL) as s:
        full = s.device_residency
        assert full is not None and full.streamed == ()
        want = [s.forward(ids)] + [s.forward([t]) for t in (5, 8)]
    budget = full.total_bytes - full.resident_bytes // 3
    with Session(tiny, device="webgpu", plan_cache=False, gpu_budget_bytes=budget, **SMALL) as s:
        assert s.device_residency is not None and s.device_residency.streamed
        got = [s.forward(ids)] + [s.forward([t]) for t in (5, 8)]
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_webgpu_streams_expert_banks_stored_one_tensor_per_expert(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An HF MoE checkpoint keeps each expert in its own tensor (an ``experts.*`` bank reference): streamed to the
    device, each shard is gathered expert by expert from the store, and the logits equal the resident run's."""
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    import loader_helpers as H

    from uaii.backends.webgpu import WebGpuBackend

    status = WebGpuBackend(allow_software=True).probe()
    if not status.available:
        pytest.skip(f"no WebGPU adapter: {status.reason}")
    monkeypatch.setenv("UAII_ALLOW_SOFTWARE_GPU", "1")
    d = H.save_tiny("qwen2moe", tmp_path / "qwen2moe")
    ids = [5, 9, 13, 2, 7]
    with Session(d, device="webgpu", plan_cache=False, **SMALL) as s:
        full = s.device_residency
        assert full is not None and full.streamed == ()
        want = s.forward(ids)
    budget = full.total_bytes - full.resident_bytes // 2
    with Session(d, device="webgpu", plan_cache=False, gpu_budget_bytes=budget, **SMALL) as s:
        assert s.device_residency is not None
        assert any("*" in ref for ref in s.device_residency.streamed), s.device_residency.streamed
        got = s.forward(ids)
    np.testing.assert_array_equal(got, want)


def test_a_streamed_expert_bank_counts_the_expert_area(tmp_path: Path) -> None:
    """A backend whose chosen experts pass through one more buffer (Capabilities.expert_staging: CUDA's expert area)
    gets it counted once a bank streams, within the same budget; without a streamed bank, or without the capability,
    the staging buffers are the backend's own."""
    import loader_helpers as H

    g = load_bundle(H.save_tiny("qwen2moe", tmp_path / "qwen2moe")).graph
    whole = residency(g, 1 << 30, staging_buffers=2, expert_staging=True)
    assert whole.streamed == () and whole.staging_buffers == 2
    budget = whole.resident_bytes * 2 // 3
    plain = residency(g, budget, staging_buffers=2)
    area = residency(g, budget, staging_buffers=2, expert_staging=True)
    assert any("experts" in ref for ref in area.streamed), area.streamed
    assert plain.staging_buffers == 2 and area.staging_buffers == 3
    assert area.staging_bytes % 3 == 0 and area.total_bytes <= budget and plain.total_bytes <= budget
    assert "(3 buffers)" in area.describe()
