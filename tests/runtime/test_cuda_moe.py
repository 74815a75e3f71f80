"""A MoE prefill on the CUDA executor: each expert's chosen rows through the int8 GEMM (moe_group + mmq_idx_<type>),
the weights read once for all the rows that chose them — not a GEMV per (token, slot) pair, which reads an
expert's weights once for each of its rows. On the host model of a device (uaii.backends.cuda.host.HostDevice)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from repo_scripts import load_script

from uaii.backends.cuda import lower
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.host import HostDevice


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A 2-layer mixtral-style MoE (8 experts, top 2, random Q4_0; bench/synth_gguf.py)."""
    pytest.importorskip("gguf")
    from uaii.loaders import load_model
    from uaii.storage import MmapStore

    synth = load_script("bench/synth_gguf.py", "synth_gguf_for_cuda_moe")
    path = synth.write_moe_gguf(tmp_path_factory.mktemp("moe") / "moe.gguf", n_layers=2, d_model=256,
                                d_ff_expert=128, n_experts=8, top_k=2, vocab=1024, n_heads=4, n_kv_heads=2)
    model = load_model(path)
    with MmapStore(model.weights) as store:
        yield model, store


def run(model: Any, store: Any, prompt: list[int]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The prompt's logits, one decode step's, and the kernels launched."""
    dev = HostDevice(kernels="compiled")
    exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=32)
    try:
        state = exe.new_state(64)
        first = state.reserve(len(prompt))
        pre = exe.run({"tokens": np.array(prompt), "positions": np.arange(first, first + len(prompt))},
                      state)["logits"]
        step = exe.run({"tokens": np.array([int(np.argmax(pre[-1]))]), "positions": np.array([state.reserve(1)])},
                       state)["logits"]
        return pre, step, list(dev.launches)
    finally:
        exe.close()
        dev.close()


def test_a_moe_prefill_takes_each_experts_rows_through_the_int8_gemm(moe: tuple[Any, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """24 tokens: the experts' products are moe_group + mmq_idx_q4_0 (one launch a bank); the int8 GEMV per pair
    (gemvq_idx, what the prefill ran before, forced here) multiplies the same int8 activations, so the two agree to
    float rounding (on the host model's references: bit for bit), and so does the decode step after it, which keeps
    the GEMV per pair."""
    model, store = moe
    prompt = list(np.random.default_rng(3).integers(3, 1000, 24))
    grouped, grouped_step, launches = run(model, store, prompt)
    assert launches.count("moe_group") == 2 and launches.count("mmq_idx_q4_0") == 2 * 3  # per layer, per bank
    assert "gemvq_idx_q4_0" in launches and "gemv_idx_q4_0" not in launches  # the decode step: int8 per pair
    monkeypatch.setattr(lower, "GROUPED_TOKENS", 1 << 30)
    pairs, pairs_step, plain = run(model, store, prompt)
    assert "mmq_idx_q4_0" not in plain and "moe_group" not in plain
    assert plain.count("gemvq_idx_q4_0") == launches.count("gemvq_idx_q4_0") + 2 * 3
    scale = float(np.abs(pairs).max())
    assert float(np.abs(grouped - pairs).max()) <= 1e-5 * scale
    assert float(np.abs(grouped_step - pairs_step).max()) <= 1e-5 * scale


def test_the_moe_nodes_of_a_binding_share_their_scratch(moe: tuple[Any, Any]) -> None:
    """Both layers' MoE products (per-pair outputs, quantized activations, the experts' lists) and every product's
    quantized activations live in scratch the binding's nodes share: a 48-layer prefill once held 48 of each."""
    model, store = moe
    dev = HostDevice(kernels="compiled")
    sizes: list[int] = []
    alloc = dev.alloc

    def recorded(nbytes: int) -> Any:
        sizes.append(int(nbytes))
        return alloc(nbytes)
    dev.alloc = recorded  # type: ignore[method-assign]
    exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=32)
    try:
        state = exe.new_state(64)
        before = len(sizes)
        exe.run({"tokens": np.arange(3, 27), "positions": np.arange(state.reserve(24), 24)}, state)
        bound = sizes[before:]
    finally:
        exe.close()
        dev.close()
    pairs, ff, d = 24 * 2, 128, 256
    assert bound.count(4 * pairs * (2 * ff + d)) == 1  # the MoE scratch: one for both layers
    assert len(bound) < 12, bound  # the binding's own buffers: a handful, not a few per layer
