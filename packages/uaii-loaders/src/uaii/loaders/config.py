"""One typed model configuration, normalized from GGUF metadata or a Hugging Face ``config.json``.

Architecture builders read only :class:`ModelConfig`; where the two sources disagree in convention, the
normalization here records the difference as data instead of letting builders branch on the source format:

* ``rope.mode`` — Hugging Face applies RoPE to the two halves of a head (``neox``). llama.cpp's converter
  permutes the Q/K rows of llama-family models so that GGUF llama applies it to adjacent pairs (``normal``);
  the other architectures keep ``neox`` in GGUF too.
* ``norm_unit_offset`` — Gemma's RMSNorm computes ``x * (1 + w)`` in HF; llama.cpp's converter adds 1 to the
  stored weights, so GGUF gemma norms are plain ``x * w``.

GGUF metadata is normalized here (:func:`from_gguf`); ``config.json`` of both transformers generations in
:mod:`uaii.loaders.hf_config` (:func:`~uaii.loaders.hf_config.from_hf`), which builds on the types and
lookups of this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .errors import LoaderError
from .limits import MAX_CONTEXT, MAX_EXPERTS, MAX_LAYERS, check_count

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "bert", "mixtral",
                 "qwen2moe", "qwen3moe")

# Hugging Face model_type → canonical architecture.
HF_MODEL_TYPES = {
    "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3",
    "gemma3_text": "gemma3", "phi3": "phi3", "gpt2": "gpt2", "bert": "bert", "mixtral": "mixtral",
    "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
}
# GGUF general.architecture → canonical (llama with experts becomes mixtral, see from_gguf).
GGUF_ARCHS = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3",
              "phi3": "phi3", "gpt2": "gpt2", "bert": "bert", "qwen2moe": "qwen2moe", "qwen3moe": "qwen3moe"}
# Architectures whose GGUF conversion permutes Q/K into adjacent-pair RoPE.
_GGUF_NORMAL_ROPE = frozenset({"llama", "mistral", "mixtral"})
_ROPELESS = frozenset({"gpt2", "bert"})
_GEMMA3_SWA_PERIOD = 6  # llama.cpp: every 6th gemma3 layer is global


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding. ``scaling`` is none | linear | llama3 | yarn | longrope."""

    theta: float
    dims: int
    mode: str = "neox"
    scaling: str = "none"
    factor: float = 1.0
    original_context: int = 0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    local_theta: float = 0.0  # theta of sliding-window layers where it differs (gemma3), else 0
    attn_factor: float = 1.0  # yarn / longrope magnitude scale
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    short_factors: tuple[float, ...] = ()
    long_factors: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    """Everything a builder needs, in one convention. Sizes are ints; ``0`` means "absent"."""

    architecture: str
    source: str  # "gguf" | "hf"
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope: RopeConfig | None = None
    activation: str = "silu"  # silu | gelu_tanh | gelu
    sliding_window: int = 0
    sliding_layers: tuple[bool, ...] = ()  # per layer: True where attention uses the sliding window
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embedding_scale: float = 1.0
    norm_unit_offset: bool = False
    tied_embeddings: bool = False
    qkv_bias: bool = False
    causal: bool = True
    n_experts: int = 0
    n_experts_used: int = 0
    d_ff_expert: int = 0
    d_ff_shared: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()  # MoE models: layers with a dense MLP instead of experts
    type_vocab_size: int = 0
    pooling: str = ""  # bert: pooler | cls | mean (see arch/bert.py)
    bos_token_id: int = -1
    eos_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def with_(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    def to_metadata(self) -> dict[str, str]:
        """The config as graph metadata strings (``config.<field>``)."""
        out: dict[str, str] = {}
        for key, value in asdict(self).items():
            if key == "rope":
                for k, v in (value or {}).items():
                    out[f"config.rope.{k}"] = _text(v)
            elif key == "extra":
                out.update({f"config.extra.{k}": str(v) for k, v in value.items()})
            else:
                out[f"config.{key}"] = _text(value)
        return out


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (tuple, list)):
        return ",".join(_text(x) for x in v)
    return str(v)


# --- typed lookups ------------------------------------------------------------------------------------------
class _Src:
    """Typed access to a dict of settings; errors name the key and the source."""

    def __init__(self, data: Mapping[str, Any], where: str, prefix: str = "") -> None:
        self.data, self.where, self.prefix = data, where, prefix

    def raw(self, key: str) -> Any:
        return self.data.get(self.prefix + key)

    def int(self, key: str, default: int | None = None) -> int:
        v = self.raw(key)
        if v is None:
            if default is None:
                raise LoaderError(f"{self.where}: missing required setting {self.prefix + key!r}")
            return default
        if isinstance(v, np.ndarray) and v.ndim:  # per-layer arrays (GGUF): all must agree
            vals = set(v.tolist())
            if len(vals) != 1:
                raise LoaderError(f"{self.where}: {self.prefix + key!r} varies per layer ({sorted(vals)}); "
                                  "per-layer sizes are not supported")
            v = vals.pop()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < 0:
            raise LoaderError(f"{self.where}: {self.prefix + key!r} must be a non-negative integer, "
                              f"found {v!r}")
        return int(v)

    def float(self, key: str, default: float) -> float:
        v = self.raw(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LoaderError(f"{self.where}: {self.prefix + key!r} must be a finite number, found {v!r}")
        return float(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.raw(key)
        return default if v is None else bool(v)


def _check(cfg: ModelConfig, where: str) -> ModelConfig:
    for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim"):  # vocab: see the loader

        if getattr(cfg, name) <= 0:
            raise LoaderError(f"{where}: {name} must be positive, found {getattr(cfg, name)}")
    if cfg.n_heads % cfg.n_kv_heads:
        raise LoaderError(f"{where}: {cfg.n_heads} attention heads are not a multiple of "
                          f"{cfg.n_kv_heads} KV heads")
    if cfg.rope is not None and (cfg.rope.dims <= 0 or cfg.rope.dims > cfg.head_dim or cfg.rope.dims % 2):
        raise LoaderError(f"{where}: rotary dims {cfg.rope.dims} must be even and at most "
                          f"head_dim {cfg.head_dim}")
    if cfg.is_moe and not 0 < cfg.n_experts_used <= cfg.n_experts:
        raise LoaderError(f"{where}: {cfg.n_experts_used} experts per token out of {cfg.n_experts}")
    if len(cfg.sliding_layers) not in (0, cfg.n_layers):
        raise LoaderError(f"{where}: {len(cfg.sliding_layers)} layer types for {cfg.n_layers} layers")
    return cfg


def unknown_architecture(name: str, where: str) -> LoaderError:
    return LoaderError(f"{where}: architecture {name!r} is not supported; "
                       f"supported: {', '.join(ARCHITECTURES)}")


# --- GGUF metadata ------------------------------------------------------------------------------------------
def _gguf_sliding(c: _Src, arch: str, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    window = c.int("attention.sliding_window", 0)
    if not window:
        return 0, ()
    pattern = c.raw("attention.sliding_window_pattern")
    if pattern is not None and hasattr(pattern, "tolist"):  # one flag per layer
        if len(pattern) != n_layers:
            raise LoaderError(f"{c.where}: {c.prefix}attention.sliding_window_pattern has {len(pattern)} "
                              f"entries for {n_layers} layers")
        flags = tuple(bool(x) for x in pattern.tolist())
    else:
        period = int(pattern) if isinstance(pattern, int) and pattern > 0 else (
            _GEMMA3_SWA_PERIOD if arch == "gemma3" else 0)
        flags = tuple((i + 1) % period != 0 for i in range(n_layers)) if period else (True,) * n_layers
    return (window, flags) if any(flags) else (0, ())


def _gguf_rope(c: _Src, arch: str, head_dim: int, ctx: int) -> RopeConfig | None:
    if arch in _ROPELESS:
        return None
    kind = str(c.raw("rope.scaling.type") or "none")
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise LoaderError(f"{c.where}: rope scaling {kind!r} is not supported (none, linear, yarn, longrope)")
    factor = c.float("rope.scaling.factor", 1.0)
    if factor == 1.0 and kind != "longrope":
        kind = "none"
    orig = c.int("rope.scaling.original_context_length", 0 if kind == "none" else ctx)

    return RopeConfig(theta=c.float("rope.freq_base", 10000.0), dims=c.int("rope.dimension_count", head_dim),
                      mode="normal" if arch in _GGUF_NORMAL_ROPE else "neox", scaling=kind, factor=factor,
                      original_context=orig,
                      attn_factor=c.float("rope.scaling.attn_factor", 1.0),
                      beta_fast=c.float("rope.scaling.yarn_beta_fast", 32.0),
                      beta_slow=c.float("rope.scaling.yarn_beta_slow", 1.0),
                      local_theta=10000.0 if arch == "gemma3" else 0.0)


def from_gguf(meta: Mapping[str, Any], where: str = "model.gguf") -> ModelConfig:
    """Normalize GGUF metadata (``general.architecture`` and the ``<arch>.*`` keys)."""
    gguf_arch = str(meta.get("general.architecture", ""))
    if gguf_arch not in GGUF_ARCHS:
        raise unknown_architecture(gguf_arch or "<missing general.architecture>", where)
    c = _Src(meta, where, gguf_arch + ".")
    arch = GGUF_ARCHS[gguf_arch]
    n_experts = c.int("expert_count", 0)
    if arch in ("llama", "mistral") and n_experts:
        arch = "mixtral"
    d, n_heads = c.int("embedding_length"), c.int("attention.head_count")
    head_dim = c.int("attention.key_length", d // n_heads if n_heads else 0)
    n_layers, ctx = c.int("block_count"), c.int("context_length", 0)
    for key, value, limit in (("block_count", n_layers, MAX_LAYERS), ("context_length", ctx, MAX_CONTEXT),
                              ("expert_count", n_experts, MAX_EXPERTS)):  # before any per-layer table
        check_count(value, limit, c.prefix + key, where)
    window, flags = _gguf_sliding(c, arch, n_layers)
    tok = _Src(meta, where, "tokenizer.ggml.")
    vocab = c.int("vocab_size", 0) or len(meta.get("tokenizer.ggml.tokens") or ())
    eos = tok.int("eos_token_id", 0) if tok.raw("eos_token_id") is not None else -1
    cfg = ModelConfig(
        architecture=arch, source="gguf", n_layers=n_layers, d_model=d, n_heads=n_heads,
        n_kv_heads=c.int("attention.head_count_kv", n_heads), head_dim=head_dim,
        d_ff=c.int("feed_forward_length", 0), vocab_size=vocab, context_length=ctx,
        norm_eps=c.float("attention.layer_norm_rms_epsilon", c.float("attention.layer_norm_epsilon", 1e-6)),
        rope=_gguf_rope(c, arch, head_dim, ctx), sliding_window=window, sliding_layers=flags,
        activation={"gemma3": "gelu_tanh", "gpt2": "gelu_tanh", "bert": "gelu"}.get(arch, "silu"),
        attn_softcap=c.float("attn_logit_softcapping", 0.0),
        final_softcap=c.float("final_logit_softcapping", 0.0),
        causal=c.bool("attention.causal", arch != "bert"),
        n_experts=n_experts, n_experts_used=c.int("expert_used_count", 0),
        d_ff_expert=c.int("expert_feed_forward_length", c.int("feed_forward_length", 0)) if n_experts else 0,
        d_ff_shared=c.int("expert_shared_feed_forward_length", 0),
        norm_topk_prob=c.bool("expert_weights_norm", arch in ("mixtral", "qwen3moe")),
        bos_token_id=tok.int("bos_token_id", 0) if tok.raw("bos_token_id") is not None else -1,
        eos_token_ids=(eos,) if eos >= 0 else (),
    )
    if arch == "gemma3":
        # llama.cpp: the 27B model scales queries by 1/sqrt(d_model / n_heads), the others by
        # 1/sqrt(head_dim).
        scale = (d // n_heads) ** -0.5 if n_layers == 62 else head_dim ** -0.5
        cfg = cfg.with_(embedding_scale=math.sqrt(d), attn_scale=scale)
    if arch == "bert":
        kind = c.int("pooling_type", 2)  # llama.cpp's enum llama_pooling_type
        pooling = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}.get(kind)
        if pooling is None:
            raise LoaderError(f"{where}: bert.pooling_type = {kind} is not a pooling type llama.cpp defines "
                              "(0 none, 1 mean, 2 cls, 3 last, 4 rank)")
        cfg = cfg.with_(pooling=pooling)
    return _check(cfg, where)


__all__ = ["ARCHITECTURES", "GGUF_ARCHS", "HF_MODEL_TYPES", "ModelConfig", "RopeConfig", "from_gguf",
           "unknown_architecture"]
