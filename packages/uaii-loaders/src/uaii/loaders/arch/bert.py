"""BERT encoder: word + position + token-type embeddings, post-norm layers, bidirectional attention.

Inputs ``tokens``, ``positions`` and ``token_types`` (i64 ``[seq]``); outputs ``hidden_states`` (the token
embeddings, ``[seq, d_model]``) and ``pooled`` (``[1, d_model]``), chosen by ``config.pooling``:

- ``pooler`` (HF directories): ``tanh(dense(h[0]))``, HF's ``pooler_output``; ``h[0]`` when the checkpoint has
  no pooler weights;
- ``cls`` (GGUF ``pooling_type`` 2, sentence-transformers ``pooling_mode_cls_token``): ``h[0]``;
- ``mean`` (GGUF ``pooling_type`` 1, sentence-transformers ``pooling_mode_mean_tokens``): the mean of ``h`` over
  the tokens. The graph holds one unpadded sequence, so this equals the attention-masked mean of
  sentence-transformers.

No KV cache: an encoder sees the whole sequence at once.
"""

from __future__ import annotations

from uaii.ir import DType, Graph
from uaii.ir.ops import Op

from ..config import ModelConfig
from ..errors import LoaderError
from ..weights import WeightSet
from .builder import SEQ, GraphBuilder, require_weights
from .gpt2 import embed_sum


class Bert:
    arch = "bert"

    def __init__(self, cfg: ModelConfig, ws: WeightSet) -> None:
        self.cfg, self.ws, self.b = cfg, ws, GraphBuilder(cfg, ws)

    def build(self, name: str) -> Graph:
        cfg, b = self.cfg, self.b
        require_weights(self.ws, ["token_embd.weight", "position_embd.weight", "token_embd_norm.weight"],
                        self.arch)
        parts = [(b.input("tokens", DType.I64, (SEQ,)), "token_embd.weight", "embd"),
                 (b.input("positions", DType.I64, (SEQ,)), "position_embd.weight", "pos_embd")]
        if b.has("token_types.weight"):
            parts.append((b.input("token_types", DType.I64, (SEQ,)), "token_types.weight", "type_embd"))
        x = b.layer_norm(embed_sum(b, parts, cfg.d_model), "token_embd_norm", "embd_norm")
        for i in range(cfg.n_layers):
            p = f"blk.{i}"
            q, k, v = (b.heads(b.linear(x, f"{p}.attn_{n}.weight", f"{p}.{n}", f"{p}.attn_{n}.bias"),
                               cfg.n_heads, f"{p}.{n}.heads") for n in "qkv")
            a = b.attention(q, k, v, i, f"{p}.attn", cache=False, causal=False)
            a = b.linear(b.merge_heads(a, f"{p}.attn.merged"), f"{p}.attn_output.weight", f"{p}.attn_out",
                         f"{p}.attn_output.bias")
            x = b.add(x, a, f"{p}.attn_residual")
            x = b.layer_norm(x, f"{p}.attn_output_norm", f"{p}.attn_output_norm")
            h = b.linear(x, f"{p}.ffn_up.weight", f"{p}.ffn_up", f"{p}.ffn_up.bias")
            h = b.op(Op.GELU, [h], f"{p}.ffn_act", b.shape_of(h),
                     approximate="tanh" if cfg.activation == "gelu_tanh" else "none")
            h = b.linear(h, f"{p}.ffn_down.weight", f"{p}.ffn_down", f"{p}.ffn_down.bias")
            x = b.add(x, h, f"{p}.ffn_residual")
            x = b.layer_norm(x, f"{p}.layer_output_norm", f"{p}.layer_output_norm")

        hidden = b.op(Op.IDENTITY, [x], "hidden_states", b.shape_of(x))
        b.output(hidden)
        if cfg.pooling != "none":  # GGUF pooling_type 0: the per-token hidden states are the embeddings
            b.output(self.pool(hidden))
        return b.graph(name, {**cfg.to_metadata(), "model.name": name, "model.architecture": self.arch})

    def pool(self, hidden: str) -> str:
        b, d, pooling = self.b, self.cfg.d_model, self.cfg.pooling
        if pooling == "mean":
            return b.op(Op.REDUCE_MEAN, [hidden], "pooled", (1, d), axes=(0,), keepdims=True)
        if pooling == "last":
            return b.op(Op.SLICE, [hidden], "pooled", (1, d), starts=(-1,), ends=(2**31 - 1,), axes=(0,))
        if pooling not in ("pooler", "cls"):
            raise LoaderError(f"{self.ws.where}: {pooling!r} pooling is not supported (a reranker's rank pooling "
                              "needs its classifier head); none, cls, last, mean and HF's pooler are")
        head = pooling == "pooler" and b.has("pooler.weight")
        first = b.op(Op.SLICE, [hidden], "cls" if head else "pooled", (1, d), starts=(0,), ends=(1,), axes=(0,))
        if not head:
            return first
        y = b.linear(first, "pooler.weight", "pooler", "pooler.bias")
        return b.op(Op.TANH, [y], "pooled", (1, d))


__all__ = ["Bert"]
