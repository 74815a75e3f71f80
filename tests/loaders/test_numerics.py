"""The graphs compute what transformers computes.

uaii-ir's reference evaluator runs each tiny model's graph (weights read through the
weight index) and compares the logits with the transformers model that wrote the checkpoint. Both the HF
directory and its f32 GGUF conversion are checked, so the conventions that differ between the two namings
(llama's permuted Q/K with adjacent-pair RoPE, gemma's 1 + w norms, GPT-2's transposed Conv1D weights, MoE banks)
are checked by value, not only by shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir.reference import evaluate
from uaii.loaders import LoadedModel, load_model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7], dtype=np.int64)


def _weight(m: LoadedModel, t: Any) -> np.ndarray:
    key = str(t.weight)
    if key in m.weights.virtual_banks:
        return np.stack([m.weights.read_numpy(t.weight.with_expert(e)) for e in range(t.shape[0])])
    return m.weights.read_numpy(t.weight).reshape(t.shape)


def run_graph(m: LoadedModel, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the whole graph with uaii-ir's reference evaluator, weights read through the weight index."""
    return evaluate(m.graph, feeds, lambda t: _as_evaluated(_weight(m, t)))


def _as_evaluated(w: np.ndarray) -> np.ndarray:
    """Float weights as float32; integer ones as stored: an MLX weight's packed words and uint8 scale codes, and bf16
    (uint16 words, the IR's convention, which the evaluator reads as bf16)."""
    return w if w.dtype.kind in "iu" else w.astype(np.float32)


def _feeds(m: LoadedModel) -> dict[str, np.ndarray]:
    feeds = {"tokens": TOKENS, "positions": np.arange(len(TOKENS), dtype=np.int64),
             "token_types": np.zeros(len(TOKENS), dtype=np.int64)}
    for name in m.graph.inputs:
        if name.startswith("past_"):
            t = m.graph.tensor(name)
            feeds[name] = np.zeros((0, *t.shape[1:]), dtype=np.float32)
    return {k: v for k, v in feeds.items() if k in m.graph.inputs}


def _transformers_outputs(arch: str, hf_dir: Path) -> dict[str, np.ndarray]:
    import transformers

    _, model_name, _ = H.TINY[arch]
    model = getattr(transformers, model_name).from_pretrained(hf_dir, attn_implementation="eager").eval()
    ids = torch.from_numpy(TOKENS)[None]
    with torch.no_grad():
        if arch == "bert":
            out = model(ids, token_type_ids=torch.zeros_like(ids))
            return {"hidden_states": out.last_hidden_state[0].numpy(), "pooled": out.pooler_output.numpy()}
        return {"logits": model(ids).logits[0].numpy()}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("numerics")
    out: dict[str, Path] = {}
    for arch in H.TINY:
        out[arch] = H.save_tiny(arch, root / arch)
        out[f"{arch}.gguf"] = H.hf_to_gguf(out[arch], root / f"{arch}.gguf", arch, "f32")[0]
    return out


def test_phi3_longrope_matches_transformers(tmp_path: Path) -> None:
    """Past the original context, transformers switches to the long factors and scales cos/sin."""
    import json

    d = H.save_tiny("phi3", tmp_path / "phi3")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(max_position_embeddings=512, original_max_position_embeddings=8,
               rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0]})
    (d / "config.json").write_text(json.dumps(cfg))
    want = _transformers_outputs("phi3", d)["logits"]
    gguf_path = H.hf_to_gguf(d, tmp_path / "phi3.gguf", "phi3", "f32")[0]
    for m in (load_model(d), load_model(gguf_path)):
        np.testing.assert_allclose(run_graph(m, _feeds(m))["logits"], want, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("arch", sorted(H.TINY))

def test_graph_matches_transformers(converted: dict[str, Path], arch: str) -> None:
    want = _transformers_outputs(arch, converted[arch])
    for key in (arch, f"{arch}.gguf"):
        m = load_model(converted[key])
        got = run_graph(m, _feeds(m))
        for name, ref in want.items():
            if arch == "bert" and name == "pooled" and key.endswith(".gguf"):
                continue  # llama.cpp drops BERT's pooler; the GGUF graph pools by the first token
            assert got[name].shape == ref.shape, (key, name)
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-5, err_msg=f"{key}: {name}")
        # the caches hold the new keys and values
        if "present_k.0" in got:
            assert got["present_k.0"].shape == (len(TOKENS), m.config.n_kv_heads, m.config.head_dim)
