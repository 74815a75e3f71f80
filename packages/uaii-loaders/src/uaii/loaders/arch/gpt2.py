"""GPT-2: learned absolute positions, LayerNorm with bias, fused QKV with bias, GELU (tanh) MLP, tied head.

Hugging Face stores GPT-2's linear weights as ``Conv1D`` (``[in, out]``); the builder sets ``transpose_b``
from the weight's layout, so the HF checkpoint and the (transposed) GGUF conversion give the same graph.
"""

from __future__ import annotations

from uaii.ir import DType, Graph
from uaii.ir.ops import Op

from ..config import ModelConfig
from ..weights import WeightSet
from .builder import ACT, SEQ, GraphBuilder, require_weights


def embed_sum(b: GraphBuilder, parts: list[tuple[str, str, str]], d: int) -> str:
    """Sum of embedding lookups ``(indices, table weight, value name)``, cast to f32 where needed."""
    total = ""
    for idx, wname, out in parts:
        y = b.embedding(idx, wname, out, d)
        total = y if not total else b.add(total, y, f"{out}.sum")
    return total


class GPT2:
    arch = "gpt2"

    def __init__(self, cfg: ModelConfig, ws: WeightSet) -> None:
        self.cfg, self.ws, self.b = cfg, ws, GraphBuilder(cfg, ws)

    def build(self, name: str) -> Graph:
        cfg, b = self.cfg, self.b
        require_weights(self.ws, ["token_embd.weight", "position_embd.weight", "output_norm.weight"],
                        self.arch)
        tokens = b.input("tokens", DType.I64, (SEQ,))
        positions = b.input("positions", DType.I64, (SEQ,))
        x = embed_sum(b, [(tokens, "token_embd.weight", "embd"),
                          (positions, "position_embd.weight", "pos_embd")], cfg.d_model)

        d = cfg.d_model
        for i in range(cfg.n_layers):
            p = f"blk.{i}"
            h = b.layer_norm(x, f"{p}.attn_norm", f"{p}.attn_norm")
            qkv = b.linear(h, f"{p}.attn_qkv.weight", f"{p}.attn_qkv", f"{p}.attn_qkv.bias")
            b.op(Op.SPLIT, [qkv], f"{p}.q", (SEQ, d), extra_outputs=[(f"{p}.k", ACT, (SEQ, d)),
                                                                     (f"{p}.v", ACT, (SEQ, d))], axis=-1)
            q, k, v = (b.heads(f"{p}.{n}", cfg.n_heads, f"{p}.{n}.heads") for n in "qkv")
            a = b.attention(q, k, v, i, f"{p}.attn", causal=True)
            a = b.linear(b.merge_heads(a, f"{p}.attn.merged"), f"{p}.attn_output.weight", f"{p}.attn_out",
                         f"{p}.attn_output.bias")
            x = b.add(x, a, f"{p}.attn_residual")
            h = b.layer_norm(x, f"{p}.ffn_norm", f"{p}.ffn_norm")
            h = b.linear(h, f"{p}.ffn_up.weight", f"{p}.ffn_up", f"{p}.ffn_up.bias")
            h = b.op(Op.GELU, [h], f"{p}.ffn_act", b.shape_of(h), approximate="tanh")
            h = b.linear(h, f"{p}.ffn_down.weight", f"{p}.ffn_down", f"{p}.ffn_down.bias")
            x = b.add(x, h, f"{p}.ffn_residual")
        x = b.layer_norm(x, "output_norm", "output_norm")
        logits = b.linear(x, "output.weight" if b.has("output.weight") else "token_embd.weight", "logits")
        b.outputs.insert(0, logits)
        return b.graph(name, {**cfg.to_metadata(), "model.name": name, "model.architecture": self.arch})


__all__ = ["GPT2", "embed_sum"]
