"""Every tiny decoder architecture through the cuda backend against transformers: the same tiny random f32 models as
test_transformers_parity.py, run by a Session on device="cuda" — on the host model of a device (every launch through
its kernel's CPU reference) and, where one exists, on a CUDA device. Tolerance as the webgpu backend's: max |Δ logit|
<= 1e-3. MoE models route on the device and multiply only the chosen experts; under a small device budget their
banks stream in pieces of experts and give the resident logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.backends import registry
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.device import first_device
from uaii.backends.cuda.host import HostDevice
from uaii.runtime import Session

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "mixtral", "qwen2moe", "qwen3moe"]
TOL = 1e-3
N_PREFILL, N_DECODE = 12, 8


@pytest.fixture(scope="module", params=["host", "compiled", "cuda"])
def device(request: pytest.FixtureRequest) -> Any:
    """The host model (references; ``compiled``: the thread-local kernels' CUDA source built by the host compiler),
    or a CUDA device."""
    dev = {"host": HostDevice, "compiled": lambda: HostDevice(kernels="compiled"), "cuda": first_device}[
        request.param]()
    if dev is None:
        pytest.skip("no CUDA device")
    yield dev
    dev.close()


def _reference(hf_dir: Path, ids: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor(ids[None, :])).logits[0].float().numpy()


def _steps(hf: Path, ids: np.ndarray, **options: Any) -> np.ndarray:
    with Session(hf, device="cuda", plan_cache=False, **options) as s:
        return np.stack([s.forward(ids[:N_PREFILL].tolist())] + [s.forward([int(t)]) for t in ids[N_PREFILL:]])


@pytest.mark.parametrize("arch", ARCHS)
def test_decoder_matches_transformers_on_cuda(tmp_path: Path, arch: str, device: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=device))
    hf = H.save_tiny(arch, tmp_path / arch)
    ids = np.random.default_rng(len(arch)).integers(3, 64, size=N_PREFILL + N_DECODE).astype(np.int64)
    ref = _reference(hf, ids)
    err = float(np.max(np.abs(_steps(hf, ids) - ref[N_PREFILL - 1:])))
    assert err <= TOL, err


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_streamed_expert_banks_move_only_the_chosen_experts(tmp_path: Path, arch: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A device budget below the model's weights streams the expert banks (one tensor per expert in the HF
    checkpoint): a step copies the experts its router chose, not the banks — a decode step moves at most top_k of
    the n_experts of each bank — and the logits are the resident run's, bit for bit, with the other streamed
    weights' copies ahead of the kernels or behind them."""
    hf = H.save_tiny(arch, tmp_path / arch)
    ids = np.random.default_rng(3).integers(3, 64, size=N_PREFILL + N_DECODE).astype(np.int64)
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=HostDevice()))
    resident = _steps(hf, ids, max_context=64, max_batch=16)
    for order in ("ahead", "behind"):
        monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=HostDevice(order=order)))
        with Session(hf, device="cuda", plan_cache=False, max_context=64, max_batch=16,
                     gpu_budget_bytes=160 << 10) as s:
            res = s.device_residency
            assert res is not None and any("exps" in r or "experts" in r for r in res.streamed), res.describe()
        streamed = _steps(hf, ids, max_context=64, max_batch=16, gpu_budget_bytes=160 << 10)
        np.testing.assert_array_equal(streamed, resident)
    dev = HostDevice()
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=dev))
    with Session(hf, device="cuda", plan_cache=False, max_context=64, max_batch=16, gpu_budget_bytes=160 << 10) as s:
        streamed_refs = set(s.device_residency.streamed)  # type: ignore[union-attr]
        moe = next(n for n in s.graph.nodes if n.op.startswith("MoEExperts"))
        k, e = int(moe.attrs["top_k"].value), int(moe.attrs["n_experts"].value)
        sizes = {str(t.weight): t.dtype.nbytes(int(np.prod([int(d) for d in t.shape])))
                 for t in s.graph.tensors if t.is_weight and str(t.weight) in streamed_refs}
        banks = sum(n for r, n in sizes.items() if "exps" in r or "experts" in r)
        s.forward(ids[:N_PREFILL].tolist())
        before = dev.h2d_bytes
        s.forward([int(ids[N_PREFILL])])
        moved = dev.h2d_bytes - before
    # the chosen experts, the other streamed weights, and a few hundred bytes of feeds, tables and indices
    assert banks and moved < sum(sizes.values()) - banks * (1 - k / e) + 4096, (moved, banks)


@pytest.mark.parametrize(("arch", "budget"), [("qwen3moe", 160), ("qwen2moe", 200)])
def test_the_device_expert_cache_keeps_chosen_experts_between_steps(tmp_path: Path, arch: str, budget: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What the device budget leaves once a bank streams is an expert cache (gpu_budget: expert_cache_bytes): a
    step copies only the chosen experts the cache does not hold. Against the same run without the cache: the logits
    bit for bit, and exactly the hits' bytes fewer moved."""
    import uaii.backends.cuda.executable as X

    hf = H.save_tiny(arch, tmp_path / arch)
    ids = np.random.default_rng(5).integers(3, 64, size=N_PREFILL + N_DECODE).astype(np.int64)
    opts = {"max_context": 64, "max_batch": 16, "gpu_budget_bytes": budget << 10}  # banks stream, a cache is left
    runs = {}
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(X, "bank_slots", lambda *_: {})
        dev = HostDevice()
        monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=dev))
        with Session(hf, device="cuda", plan_cache=False, **opts) as s:
            assert s.device_residency is not None and s.device_residency.expert_cache_bytes > 0
            logits = [s.forward(ids[:N_PREFILL].tolist())] + [s.forward([int(t)]) for t in ids[N_PREFILL:]]
            caches = dict(s._exe.expert_caches or {})  # type: ignore[union-attr]
            runs[cached] = (np.stack(logits), dev.h2d_bytes, caches)
    (want, moved_plain, none), (got, moved, caches) = runs[False], runs[True]
    np.testing.assert_array_equal(got, want)
    assert not none and caches and sum(c.hits for c in caches.values()) > 0
    assert moved_plain - moved == sum(c.hits * c.expert_bytes for c in caches.values())


def test_bert_and_all_rows_match_transformers_on_cuda(tmp_path: Path, device: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Bidirectional attention over the node's own keys (BERT: LayerNorm, GELU, a tanh pooler) and a decoder's
    logits for every row through ``Session.run`` (attention over the given past and new keys, no KV state)."""
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=device))
    d = H.save_tiny("bert", tmp_path / "bert")
    feeds, hidden, pooled = H.bert_case(d)
    with Session(d, device="cuda", plan_cache=False) as s:
        got = s.run(feeds)
    np.testing.assert_allclose(got["hidden_states"], hidden, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(got["pooled"], pooled, rtol=TOL, atol=TOL)
    hf = H.save_tiny("qwen3", tmp_path / "qwen3")
    ids_ = np.random.default_rng(5).integers(3, 64, size=N_PREFILL).astype(np.int64)
    with Session(hf, device="cuda", plan_cache=False) as s:
        run_feeds: dict[str, Any] = {"tokens": ids_, "positions": np.arange(N_PREFILL)}
        for name in s.graph.inputs:
            if name.startswith("past_"):
                run_feeds[name] = np.zeros((0, *s.graph.tensor(name).shape[1:]), np.float32)
        rows = s.run(run_feeds)["logits"]
    assert float(np.max(np.abs(rows - _reference(hf, ids_)))) <= TOL
