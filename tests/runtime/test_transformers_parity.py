"""Correctness against transformers: tiny random models of every decoder architecture, saved with save_pretrained
(f32, fixed seed), run by our Session from the HF directory and from GGUF conversions (f32, f16). Logits must match
transformers to max |Δ| <= 1e-4 over a 16-token prefill and 16 decode steps (and every prefill row via run())."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.runtime import Session

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "mixtral", "qwen2moe", "qwen3moe"]
TOL = 1e-4
N_PREFILL, N_DECODE = 16, 16


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {"root": tmp_path_factory.mktemp("parity")}


def _hf_dir(models: dict[str, Path], arch: str) -> Path:
    if arch not in models:
        models[arch] = H.save_tiny(arch, models["root"] / arch)
    return models[arch]


def _reference(hf_dir: Path, ids: np.ndarray, f16_matrices: bool = False) -> np.ndarray:
    """transformers' logits for every position of ``ids`` (one causal forward pass), in f32."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    if f16_matrices:  # what the f16 GGUF stores: matrices in f16, vectors (norms, biases) and positions in f32
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim >= 2 and "wpe" not in name:
                    p.copy_(p.half().float())
    with torch.no_grad():
        return model(torch.tensor(ids[None, :])).logits[0].float().numpy()


def _ours(path: Path, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(every prefill row via run(), [prefill last row + each decode step] via forward())."""
    with Session(path, plan_cache=False) as s:
        feeds: dict[str, Any] = {"tokens": ids[:N_PREFILL], "positions": np.arange(N_PREFILL)}
        for name in s.graph.inputs:
            if name.startswith("past_"):
                shape = s.graph.tensor(name).shape
                feeds[name] = np.zeros((0, *shape[1:]), np.float32)
        rows = s.run(feeds)["logits"]
        steps = [s.forward(ids[:N_PREFILL].tolist())]
        steps += [s.forward([int(t)]) for t in ids[N_PREFILL:]]
    return rows, np.stack(steps)


def _check(path: Path, ref: np.ndarray, ids: np.ndarray) -> float:
    rows, steps = _ours(path, ids)
    err_rows = float(np.max(np.abs(rows - ref[:N_PREFILL])))
    err_steps = float(np.max(np.abs(steps - ref[N_PREFILL - 1:])))
    assert err_rows <= TOL and err_steps <= TOL, (err_rows, err_steps)
    return max(err_rows, err_steps)


def _ids(arch: str) -> np.ndarray:
    rng = np.random.default_rng(len(arch))
    return rng.integers(3, 64, size=N_PREFILL + N_DECODE).astype(np.int64)


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_directory_matches_transformers(models: dict[str, Path], arch: str) -> None:
    hf = _hf_dir(models, arch)
    ids = _ids(arch)
    err = _check(hf, _reference(hf, ids), ids)
    print(f"{arch} hf: max |Δ| = {err:.2e}")


@pytest.mark.parametrize("mode", ["f32", "f16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_matches_transformers(models: dict[str, Path], arch: str, mode: str) -> None:
    hf = _hf_dir(models, arch)
    gguf = H.hf_to_gguf(hf, models["root"] / f"{arch}-{mode}.gguf", arch, mode)[0]
    ids = _ids(arch)
    err = _check(gguf, _reference(hf, ids, f16_matrices=mode == "f16"), ids)
    print(f"{arch} gguf {mode}: max |Δ| = {err:.2e}")
