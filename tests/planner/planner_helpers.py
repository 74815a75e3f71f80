"""Graphs for the planner tests: a small llama-like decoder written node by node, and random weights/feeds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from graph_builder import GraphBuilder

from uaii.ir import Graph


class Builder(GraphBuilder):
    """Names the nodes a test leaves unnamed output/op."""

    def __init__(self, name: str = "g") -> None:
        super().__init__(name, node_name=lambda op, output, index: f"{output}/{op}")


@dataclass(frozen=True)
class Dims:
    d: int = 32
    heads: int = 4
    kv: int = 2
    head_dim: int = 8
    ff: int = 48
    vocab: int = 50


SMALL = Dims()


def llama(n_layers: int = 2, *, dims: Dims = SMALL, wdtype: str = "f32", glu: str = "mul", tied: bool = False,
          gelu: bool = False) -> Graph:
    """A pre-norm decoder: Embedding, per layer RMSNorm → q/k/v MatMuls → RoPE → Attention (KV cache) → out proj
    → residual Add → RMSNorm → gate/up MatMuls → GLU → down → residual Add; final RMSNorm and lm_head.

    ``glu="mul"`` writes the GLU as ``Mul(Silu(gate), up)`` (ONNX style), ``"fused"`` as SwiGLU/GeGLU.
    ``wdtype`` is the dtype of the matrices (norms and embeddings stay f32).
    """
    D, H, KV, HD, FF, V = dims.d, dims.heads, dims.kv, dims.head_dim, dims.ff, dims.vocab
    b = Builder("llama")
    tokens = b.input("tokens", "i64", ["seq"])
    positions = b.input("positions", "i64", ["seq"])
    table = b.weight("token_embd.weight", "f32", [V, D])
    x = b.op("Embedding", [tokens, table], [("embd", "f32", ["seq", D])])
    for i in range(n_layers):
        p = f"blk.{i}"
        h = b.op("RMSNorm", [x, b.weight(f"{p}.attn_norm.weight", "f32", [D])],
                 [(f"{p}.attn_norm", "f32", ["seq", D])], eps=1e-5)
        qkv = []
        for nm, rows, n in (("q", H * HD, H), ("k", KV * HD, KV), ("v", KV * HD, KV)):
            w = b.weight(f"{p}.attn_{nm}.weight", wdtype, [rows, D])
            y = b.op("MatMul", [h, w], [(f"{p}.{nm}", "f32", ["seq", rows])], transpose_b=True)
            qkv.append(b.op("Reshape", [y], [(f"{p}.{nm}.heads", "f32", ["seq", n, HD])], shape=(0, n, HD)))
        q = b.op("RoPE", [qkv[0], positions], [(f"{p}.q.rope", "f32", ["seq", H, HD])])
        k = b.op("RoPE", [qkv[1], positions], [(f"{p}.k.rope", "f32", ["seq", KV, HD])])
        pk = b.input(f"past_k.{i}", "f32", ["past", KV, HD])
        pv = b.input(f"past_v.{i}", "f32", ["past", KV, HD])
        a = b.op("Attention", [q, k, qkv[2], pk, pv],
                 [(f"{p}.attn", "f32", ["seq", H, HD]), (f"present_k.{i}", "f32", ["past_plus_seq", KV, HD]),
                  (f"present_v.{i}", "f32", ["past_plus_seq", KV, HD])], n_heads=H, n_kv_heads=KV, head_dim=HD)
        b.outputs += [f"present_k.{i}", f"present_v.{i}"]
        a = b.op("Reshape", [a], [(f"{p}.attn.merged", "f32", ["seq", H * HD])], shape=(0, H * HD))
        o = b.op("MatMul", [a, b.weight(f"{p}.attn_output.weight", wdtype, [D, H * HD])],
                 [(f"{p}.attn_out", "f32", ["seq", D])], transpose_b=True)
        x = b.op("Add", [x, o], [(f"{p}.attn_residual", "f32", ["seq", D])])
        h = b.op("RMSNorm", [x, b.weight(f"{p}.ffn_norm.weight", "f32", [D])],
                 [(f"{p}.ffn_norm", "f32", ["seq", D])], eps=1e-5)
        g = b.op("MatMul", [h, b.weight(f"{p}.ffn_gate.weight", wdtype, [FF, D])],
                 [(f"{p}.ffn_gate", "f32", ["seq", FF])], transpose_b=True)
        u = b.op("MatMul", [h, b.weight(f"{p}.ffn_up.weight", wdtype, [FF, D])],
                 [(f"{p}.ffn_up", "f32", ["seq", FF])], transpose_b=True)
        act_op, act_attrs = ("Gelu", {"approximate": "tanh"}) if gelu else ("Silu", {})
        if glu == "mul":
            s = b.op(act_op, [g], [(f"{p}.ffn_act", "f32", ["seq", FF])], **act_attrs)
            m = b.op("Mul", [s, u], [(f"{p}.ffn_glu", "f32", ["seq", FF])])
        else:
            m = b.op("GeGLU" if gelu else "SwiGLU", [g, u], [(f"{p}.ffn_glu", "f32", ["seq", FF])], **act_attrs)
        dn = b.op("MatMul", [m, b.weight(f"{p}.ffn_down.weight", wdtype, [D, FF])],
                  [(f"{p}.ffn_down", "f32", ["seq", D])], transpose_b=True)
        x = b.op("Add", [x, dn], [(f"{p}.ffn_residual", "f32", ["seq", D])])
    n = b.op("RMSNorm", [x, b.weight("output_norm.weight", "f32", [D])], [("output_norm", "f32", ["seq", D])],
             eps=1e-5)
    head = "token_embd.weight" if tied else b.weight("output.weight", wdtype, [V, D])
    b.outputs.insert(0, b.op("MatMul", [n, head], [("logits", "f32", ["seq", V])], transpose_b=True))
    return b.build()


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in graph.weights:
        shape = tuple(int(d) for d in t.shape)
        out[t.name] = (rng.standard_normal(shape) * 0.3 + (1.0 if t.name.endswith("norm.weight") else 0.0)
                       ).astype(np.float32)
    return out


def llama_feeds(graph: Graph, seq: int = 3, past: int = 2, seed: int = 1, vocab: int = Dims().vocab
                ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {
        "tokens": rng.integers(0, vocab, seq).astype(np.int64),
        "positions": np.arange(past, past + seq, dtype=np.int64),
    }
    for name in graph.inputs:
        if name.startswith(("past_k.", "past_v.")):
            t = graph.tensor(name)
            feeds[name] = rng.standard_normal((past, *(int(d) for d in t.shape[1:]))).astype(np.float32)
    return feeds


def ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes]
