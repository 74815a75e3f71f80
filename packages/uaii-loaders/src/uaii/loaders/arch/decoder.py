"""Decoder-only language models: llama, mistral, qwen2, qwen3, gemma3, phi3, mixtral, qwen2-moe, qwen3-moe.

One pre-norm transformer, with the variations as small overrides:

    x = Embedding(tokens) [* sqrt(d) for gemma]
    per layer:  h = attn(norm(x)) [post-norm for gemma];  x += h
                h = ffn(norm(x))  [post-norm for gemma];  x += h      (ffn: GLU, or routed experts + shared)
    logits = MatMul(norm(x), output or token_embd) [softcap]

Inputs ``tokens`` and ``positions`` (i64 ``[seq]``) and per layer ``past_k.N``/``past_v.N`` (``[past,
n_kv_heads, head_dim]``); outputs ``logits`` ``[seq, vocab]`` then ``present_k.N``/``present_v.N``. Optional
pieces follow the tensors that exist (q/k/v biases, q/k norms, fused qkv, fused gate|up, rope factors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from uaii.ir import DType, Graph
from uaii.ir.ops import Op

from ..config import ModelConfig
from ..errors import LoaderError
from ..weights import Weight, WeightSet
from .builder import ACT, SEQ, GraphBuilder, require_weights

_GLU: dict[str, tuple[str, dict[str, Any]]] = {"silu":
 (Op.SWIGLU, {}), "gelu_tanh": (Op.GEGLU, {"approximate": "tanh"}),
        "gelu": (Op.GEGLU, {"approximate": "none"})}


class DecoderLM:
    """The llama layout; subclasses override the pieces that differ."""

    arch = "llama"

    def __init__(self, cfg: ModelConfig, ws: WeightSet) -> None:
        self.cfg, self.ws = cfg, ws
        self.b = GraphBuilder(cfg, ws)
        self._freq_factors: str | None = None

    # --- the whole graph ------------------------------------------------------------------------------------
    def build(self, name: str) -> Graph:
        cfg, b = self.cfg, self.b
        require_weights(self.ws, ["token_embd.weight", "output_norm.weight"], self.arch)
        tokens = b.input("tokens", DType.I64, (SEQ,))
        positions = b.input("positions", DType.I64, (SEQ,))
        x = self.embed(tokens)
        for i in range(cfg.n_layers):
            x = self.layer(i, x, positions)
        logits = self.head(x)
        b.outputs.insert(0, logits)
        meta = {**cfg.to_metadata(), "model.name": name, "model.architecture": cfg.architecture}
        return b.graph(name, meta)

    def embed(self, tokens: str) -> str:
        b = self.b
        x = b.embedding(tokens, "token_embd.weight", "embd", self.cfg.d_model)
        if self.cfg.embedding_scale != 1.0:
            scale = b.constant("embd.scale", np.array([self.cfg.embedding_scale], dtype=np.float32))
            x = b.op(Op.MUL, [x, scale], "embd.scaled", (SEQ, self.cfg.d_model))
        return x

    def layer(self, i: int, x: str, positions: str) -> str:
        b, p = self.b, f"blk.{i}"
        h = b.rms_norm(x, f"{p}.attn_norm.weight", f"{p}.attn_norm")
        h = self.attention(i, h, positions)
        if b.has(f"{p}.post_attention_norm.weight"):
            h = b.rms_norm(h, f"{p}.post_attention_norm.weight", f"{p}.post_attention_norm")
        x = b.add(x, h, f"{p}.attn_residual")
        h = b.rms_norm(x, f"{p}.ffn_norm.weight", f"{p}.ffn_norm")
        h = self.ffn(i, h)
        if b.has(f"{p}.post_ffw_norm.weight"):
            h = b.rms_norm(h, f"{p}.post_ffw_norm.weight", f"{p}.post_ffw_norm")
        return b.add(x, h, f"{p}.ffn_residual")

    def head(self, x: str) -> str:
        b, cfg = self.b, self.cfg
        x = b.rms_norm(x, "output_norm.weight", "output_norm")
        out = "output.weight" if b.has("output.weight") else "token_embd.weight"
        if cfg.final_softcap:
            y = b.linear(x, out, "logits.raw")
            return b.op(Op.SOFTCAP, [y], "logits", b.shape_of(y), cap=float(cfg.final_softcap))
        return b.linear(x, out, "logits")

    # --- attention ------------------------------------------------------------------------------------------
    def qkv(self, i: int, h: str) -> tuple[str, str, str]:
        b, cfg, p = self.b, self.cfg, f"blk.{i}"
        q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        if b.has(f"{p}.attn_qkv.weight"):
            fused = b.linear(h, f"{p}.attn_qkv.weight", f"{p}.attn_qkv", f"{p}.attn_qkv.bias")
            names = [f"{p}.q", f"{p}.k", f"{p}.v"]
            b.op(Op.SPLIT, [fused], names[0], (SEQ, q_dim),
                 extra_outputs=[(names[1], ACT, (SEQ, kv_dim)), (names[2], ACT, (SEQ, kv_dim))],
                 axis=-1, split=(q_dim, kv_dim, kv_dim))
            q, k, v = names
        else:
            q = b.linear(h, f"{p}.attn_q.weight", f"{p}.q", f"{p}.attn_q.bias")
            k = b.linear(h, f"{p}.attn_k.weight", f"{p}.k", f"{p}.attn_k.bias")
            v = b.linear(h, f"{p}.attn_v.weight", f"{p}.v", f"{p}.attn_v.bias")
        return (b.heads(q, cfg.n_heads, f"{p}.q.heads"), b.heads(k, cfg.n_kv_heads, f"{p}.k.heads"),
                b.heads(v, cfg.n_kv_heads, f"{p}.v.heads"))

    def sliding(self, i: int) -> bool:
        return bool(self.cfg.sliding_layers) and self.cfg.sliding_layers[i]

    def attention(self, i: int, h: str, positions: str) -> str:
        b, cfg, p = self.b, self.cfg, f"blk.{i}"
        q, k, v = self.qkv(i, h)
        if b.has(f"{p}.attn_q_norm.weight"):
            q = b.rms_norm(q, f"{p}.attn_q_norm.weight", f"{p}.q.norm")
            k = b.rms_norm(k, f"{p}.attn_k_norm.weight", f"{p}.k.norm")
        q, k = self.rope(i, q, positions, "q"), self.rope(i, k, positions, "k")
        y = b.attention(q, k, v, i, f"{p}.attn", causal=cfg.causal, scale=float(cfg.attn_scale),
                        sliding_window=cfg.sliding_window if self.sliding(i) else 0,
                        softcap=float(cfg.attn_softcap))
        y = b.merge_heads(y, f"{p}.attn.merged")
        return b.linear(y, f"{p}.attn_output.weight", f"{p}.attn_out", f"{p}.attn_output.bias")

    def rope_attrs(self, i: int) -> dict[str, Any]:
        rope = self.cfg.rope
        assert rope is not None
        local = self.sliding(i) and rope.local_theta > 0
        kind = rope.scaling if rope.scaling in ("linear", "llama3", "yarn") and not local else "none"
        attrs: dict[str, Any] = dict(mode=rope.mode, rotary_dims=rope.dims, scaling_type=kind,
                                     theta=float(rope.local_theta if local else rope.theta))
        if kind != "none":
            attrs.update(factor=float(rope.factor), original_max_position=rope.original_context)
        if kind == "llama3":
            attrs.update(low_freq_factor=float(rope.low_freq_factor),
                         high_freq_factor=float(rope.high_freq_factor))
        if kind == "yarn":
            attrs.update(beta_fast=float(rope.beta_fast), beta_slow=float(rope.beta_slow),
                         attn_factor=float(rope.attn_factor))
        if kind == "none" and rope.attn_factor != 1.0 and not local:
            # longrope (phi3) = per-frequency factors (freq_factors) + a magnitude on the rotated channels:
            # exactly RoPE's yarn with factor 1 (which leaves the frequencies alone) and attn_factor
            attrs.update(scaling_type="yarn", factor=1.0, attn_factor=float(rope.attn_factor),
                         original_max_position=rope.original_context or self.cfg.context_length)

        return attrs


    def freq_factors(self) -> str | None:
        """Per-frequency divisors: GGUF ``rope_freqs`` (llama3) / ``rope_factors_*`` (phi3), or longrope's."""
        if self._freq_factors is not None:
            return self._freq_factors or None
        b, rope = self.b, self.cfg.rope
        assert rope is not None
        long = rope.original_context and self.cfg.context_length > rope.original_context
        name = next((n for n in ("rope_freqs.weight", f"rope_factors_{'long' if long else 'short'}.weight")
                     if b.has(n)), None)
        if name is not None:
            self._freq_factors = b.weight(self.ws.need(name))
        elif rope.scaling == "longrope":
            factors = rope.long_factors if long else rope.short_factors
            if len(factors) != rope.dims // 2:
                raise LoaderError(f"{self.ws.where}: longrope needs {rope.dims // 2} factors, found "
                                  f"{len(factors)}")
            self._freq_factors = b.constant("rope.factors", np.asarray(factors, dtype=np.float32))
        else:
            self._freq_factors = ""
        return self._freq_factors or None

    def rope(self, i: int, x: str, positions: str, which: str) -> str:
        if self.cfg.rope is None:
            return x
        ins = [x, positions]
        ff = self.freq_factors()
        if ff is not None and not (self.sliding(i) and self.cfg.rope.local_theta > 0):
            ins.append(ff)
        return self.b.op(Op.ROPE, ins, f"blk.{i}.{which}.rope", self.b.shape_of(x), **self.rope_attrs(i))

    # --- feed-forward ---------------------------------------------------------------------------------------
    def glu(self, gate: str, up: str | None, out: str) -> str:
        op, attrs = _GLU[self.cfg.activation]
        shape = self.b.shape_of(gate)
        if up is None:
            shape = (*shape[:-1], shape[-1] // 2)  # type: ignore[operator]
        return self.b.op(op, [gate] if up is None else [gate, up], out, shape, **attrs)

    def dense_ffn(self, p: str, h: str, suffix: str = "") -> str:
        b = self.b
        up = b.linear(h, f"{p}.ffn_up{suffix}.weight", f"{p}.ffn_up{suffix}", f"{p}.ffn_up{suffix}.bias")
        if b.has(f"{p}.ffn_gate{suffix}.weight"):
            gate = b.linear(h, f"{p}.ffn_gate{suffix}.weight", f"{p}.ffn_gate{suffix}",
                            f"{p}.ffn_gate{suffix}.bias")
            act = self.glu(gate, up, f"{p}.ffn_act{suffix}")
        else:  # fused [gate; up] rows (phi3), gate first
            act = self.glu(up, None, f"{p}.ffn_act{suffix}")
        down = f"{p}.ffn_down{suffix}"
        return b.linear(act, f"{down}.weight", down, f"{down}.bias")

    def ffn(self, i: int, h: str) -> str:
        p = f"blk.{i}"
        if self.cfg.is_moe and i not in self.cfg.dense_layers:
            return self.moe_ffn(i, h)
        return self.dense_ffn(p, h)

    def moe_ffn(self, i: int, h: str) -> str:
        b, cfg, p = self.b, self.cfg, f"blk.{i}"
        n, k = cfg.n_experts, cfg.n_experts_used
        banks = [self.ws.bank(i, proj, n) for proj in ("gate", "up", "down")]
        if any(bk is None for bk in banks):
            if self.ws.bank(i, "gate_up", n) is not None:
                raise LoaderError(f"{self.ws.where}: layer {i} packs gate and up experts in one bank "
                                  "(ffn_gate_up_exps); MoEExperts takes them separately, so this model is "
                                  "indexed "
                                  "but cannot be built yet")
            raise LoaderError(f"{self.ws.where}: layer {i} has no expert banks (ffn_gate/up/down_exps)")
        logits = b.linear(h, f"{p}.ffn_gate_inp.weight", f"{p}.router.logits")
        w, idx = f"{p}.router.weights", f"{p}.router.indices"
        b.op(Op.MOE_ROUTER, [logits], w, (SEQ, k), dtype=DType.F32,
             extra_outputs=[(idx, DType.I64, (SEQ, k))], n_experts=n, top_k=k, normalize=cfg.norm_topk_prob)
        act = "silu" if cfg.activation == "silu" else "gelu"
        present = [bk for bk in banks if bk is not None]
        if any(bk.quant is not None for bk in present):
            y = self.quantized_experts(i, h, w, idx, present, act)
        else:
            y = b.op(Op.MOE_EXPERTS, [h, w, idx, *(b.weight(bk) for bk in present)],
                     f"{p}.moe", b.shape_of(h), n_experts=n, top_k=k, activation=act)
        if not b.has(f"{p}.ffn_up_shexp.weight"):
            return y
        shared = self.dense_ffn(p, h, "_shexp")
        if b.has(f"{p}.ffn_gate_inp_shexp.weight"):
            g = b.linear(h, f"{p}.ffn_gate_inp_shexp.weight", f"{p}.shexp.gate.logits")
            g = b.op(Op.SIGMOID, [g], f"{p}.shexp.gate", b.shape_of(g))
            shared = b.op(Op.MUL, [shared, g], f"{p}.shexp.gated", b.shape_of(shared))
        return b.add(y, shared, f"{p}.moe_out")


    def quantized_experts(self, i: int, h: str, w: str, idx: str, banks: list[Weight], act: str) -> str:
        """MLX-quantized expert banks (mlx-lm's SwitchGLU): QuantizedMoEExperts, inputs in its slot order."""
        b, cfg = self.b, self.cfg
        quants = [bk.quant for bk in banks]
        if any(q is None for q in quants) or len({q.params.mode for q in quants if q is not None}) != 1:
            raise LoaderError(f"{self.ws.where}: layer {i}'s expert banks mix quantization modes "
                              f"({', '.join(q.params.mode if q else 'float' for q in quants)}); QuantizedMoEExperts "
                              "takes one mode for gate, up and down")
        qs = [q for q in quants if q is not None]
        packed = [b.quantized(bk) for bk in banks]                   # [values, scales, (biases)] per bank
        ins = [h, w, idx, *(x for p in packed for x in p[:2]), *(p[2] if len(p) > 2 else "" for p in packed)]
        return b.op(Op.QUANTIZED_MOE_EXPERTS, ins, f"blk.{i}.moe", b.shape_of(h), n_experts=cfg.n_experts,
                    top_k=cfg.n_experts_used, activation=act, mode=qs[0].params.mode,
                    bits=tuple(q.params.bits for q in qs), group_sizes=tuple(q.params.group_size for q in qs))


class Llama(DecoderLM):
    arch = "llama"


class Mistral(DecoderLM):
    arch = "mistral"


class Qwen2(DecoderLM):
    arch = "qwen2"


class Qwen3(DecoderLM):
    arch = "qwen3"


class Gemma3(DecoderLM):
    """Sliding/global layers, q/k norms, four norms per layer, sqrt(d)-scaled tied embeddings."""

    arch = "gemma3"

    def build(self, name: str) -> Graph:
        require_weights(self.ws, ["blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight"],
                        self.arch)
        return super().build(name)


class Phi3(DecoderLM):
    """Fused qkv and gate|up projections."""

    arch = "phi3"


class Mixtral(DecoderLM):
    arch = "mixtral"


class Qwen2Moe(DecoderLM):
    """Routed experts without renormalization, plus a sigmoid-gated shared expert."""

    arch = "qwen2moe"


class Qwen3Moe(DecoderLM):
    arch = "qwen3moe"


BUILDERS: dict[str, type[DecoderLM]] = {
    c.arch: c for c in (Llama, Mistral, Qwen2, Qwen3, Gemma3, Phi3, Mixtral, Qwen2Moe, Qwen3Moe)}

__all__ = ["BUILDERS", "DecoderLM"]
