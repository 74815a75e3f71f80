"""The two real GGUF models of shared/MODELS.md load into validated IR graphs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from uaii.ir import DType, validate
from uaii.loaders import load_model, open_gguf
from uaii.loaders.gguf import cross_check


def test_smollm2(smollm2_path: Path) -> None:
    m = load_model(smollm2_path)
    assert validate(m.graph) == []
    cfg = m.config
    assert (cfg.architecture, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        "llama", 30, 576, 9, 3, 64)
    assert (cfg.d_ff, cfg.vocab_size, cfg.context_length) == (1536, 49152, 8192)
    assert cfg.rope is not None and cfg.rope.mode == "normal" and cfg.rope.theta == 100000.0
    assert cfg.norm_eps == 1e-5 and cfg.tied_embeddings and cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    g = m.graph
    assert g.inputs[:2] == ("tokens", "positions") and len(g.inputs) == 2 + 2 * 30
    assert g.outputs[0] == "logits" and len(g.outputs) == 1 + 2 * 30
    assert g.tensor("logits").shape == ("seq", 49152)
    assert g.tensor("past_k.29").shape == ("past", 3, 64)
    assert g.tensor("blk.0.attn_q.weight").shape == (576, 576)
    assert g.tensor("blk.0.attn_k.weight").shape == (192, 576)
    assert g.tensor("token_embd.weight").shape == (49152, 576)
    # the quant mix: Q4_1 matrices, a Q8_0 embedding (the tied head), f32 norms
    mix = Counter(t.dtype for t in g.weights)
    assert mix == {DType.Q4_1: 210, DType.F32: 61, DType.Q8_0: 1}
    assert len(m.weights) == 272 and m.weights.total_bytes() == sum(i.nbytes for i in m.weights.values())
    assert m.chat_template and "<|im_start|>" in m.chat_template
    assert m.graph.meta["config.rope.mode"] == "normal"
    assert cross_check(smollm2_path) == []  # gguf.GGUFReader agrees on every key and tensor


def test_gemma3(gemma3_path: Path) -> None:
    m = load_model(gemma3_path)
    assert validate(m.graph) == []
    cfg = m.config
    assert (cfg.architecture, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        "gemma3", 18, 640, 4, 1, 256)
    assert cfg.vocab_size == 262144 and cfg.sliding_window == 512 and cfg.tied_embeddings
    assert cfg.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(18))
    assert cfg.rope is not None and cfg.rope.theta == 1e6 and cfg.rope.local_theta == 10000.0
    assert not cfg.norm_unit_offset  # llama.cpp's converter already added 1 to the norm weights
    g = m.graph
    windows = [n.get("sliding_window") for n in g.nodes if n.op == "Attention"]
    assert windows == [0 if (i + 1) % 6 == 0 else 512 for i in range(18)]
    thetas = [n.get("theta") for n in g.nodes if n.op == "RoPE" and n.outputs[0].endswith(".q.rope")]
    assert thetas == [1e6 if (i + 1) % 6 == 0 else 10000.0 for i in range(18)]
    assert g.tensor("embd.scale").numpy()[0] == pytest.approx(640 ** 0.5)
    assert {n.get("scale") for n in g.nodes if n.op == "Attention"} == {0.0625}
    assert g.tensor("blk.0.attn_q_norm.weight").shape == (256,)
    mix = Counter(t.dtype for t in g.weights)
    assert mix == {DType.F32: 109, DType.Q5_0: 81, DType.Q4_K: 27, DType.Q8_0: 10, DType.Q6_K: 9}
    assert g.tensor("token_embd.weight").dtype is DType.Q8_0
    gf = open_gguf(gemma3_path)
    assert len(gf.metadata["tokenizer.ggml.tokens"]) == 262144
