"""Every tiny architecture through the webgpu backend (lavapipe in CI) against transformers: the same tiny random
f32 models as test_transformers_parity.py, run by a Session on device="webgpu". Tolerance: max |Δ logit| <= 1e-3
(the GPU sums in other orders than the CPU; documented in docs/backends.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.runtime import Session

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend  # noqa: E402

STATUS = WebGpuBackend(allow_software=True).probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "mixtral", "qwen2moe", "qwen3moe"]
TOL = 1e-3
N_PREFILL, N_DECODE = 12, 8


@pytest.fixture(autouse=True)
def _software_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UAII_ALLOW_SOFTWARE_GPU", "1")


def _reference(hf_dir: Path, ids: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor(ids[None, :])).logits[0].float().numpy()


@pytest.mark.parametrize("arch", ARCHS)
def test_decoder_matches_transformers_on_webgpu(tmp_path: Path, arch: str) -> None:
    hf = H.save_tiny(arch, tmp_path / arch)
    ids = np.random.default_rng(len(arch)).integers(3, 64, size=N_PREFILL + N_DECODE).astype(np.int64)
    ref = _reference(hf, ids)
    with Session(hf, device="webgpu", plan_cache=False) as s:
        feeds: dict[str, Any] = {"tokens": ids[:N_PREFILL], "positions": np.arange(N_PREFILL)}
        for name in s.graph.inputs:
            if name.startswith("past_"):
                feeds[name] = np.zeros((0, *s.graph.tensor(name).shape[1:]), np.float32)
        rows = s.run(feeds)["logits"]
        steps = [s.forward(ids[:N_PREFILL].tolist())] + [s.forward([int(t)]) for t in ids[N_PREFILL:]]
    err_rows = float(np.max(np.abs(rows - ref[:N_PREFILL])))
    err_steps = float(np.max(np.abs(np.stack(steps) - ref[N_PREFILL - 1:])))
    assert err_rows <= TOL and err_steps <= TOL, (err_rows, err_steps)


def test_bert_matches_transformers_on_webgpu(tmp_path: Path) -> None:
    d = H.save_tiny("bert", tmp_path / "bert")
    feeds, hidden, pooled = H.bert_case(d)
    with Session(d, device="webgpu", plan_cache=False) as s:
        got = s.run(feeds)
    np.testing.assert_allclose(got["hidden_states"], hidden, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(got["pooled"], pooled, rtol=TOL, atol=TOL)
