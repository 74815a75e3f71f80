"""A Hugging Face ``config.json`` → :class:`~uaii.loaders.config.ModelConfig`, as transformers 4 and 5 write it.

The two generations spell RoPE differently:

* transformers 4: top-level ``rope_theta`` and ``partial_rotary_factor``, an optional ``rope_scaling`` block,
  and for gemma3 ``rope_local_base_freq`` (the theta of sliding-window layers);
* transformers 5: a ``rope_parameters`` block holding ``rope_type``, ``rope_theta``, the scaling keys and
  sometimes ``partial_rotary_factor``; gemma3 has one block per attention type (``full_attention``,
  ``sliding_attention``). MoE counts may be ``num_local_experts`` where 4.x wrote ``num_experts``.

Both spellings are first brought to transformers 5's shape (a block per attention type) and then read once. A
setting spelled in both places must agree, and a RoPE type or a key inside a block that UAII does not implement
is refused, never defaulted: ignoring one would load a model that computes something else. Where the
generations read one file differently (a longrope ``factor`` beside phi3's top-level original context), UAII
reads it as transformers 5 does.

Sizes are bounded before anything per layer is built: a tuple per layer of ``num_hidden_layers: 1e9`` is 8 GB.
The loader checks them against the checkpoint's tensors too (:mod:`uaii.loaders.hf`, :mod:`uaii.loaders.arch`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .config import (
    _GEMMA3_SWA_PERIOD,
    _ROPELESS,
    HF_MODEL_TYPES,
    ModelConfig,
    RopeConfig,
    _check,
    _Src,
    unknown_architecture,
)
from .errors import LoaderError
from .limits import MAX_CONTEXT, MAX_EXPERTS, MAX_LAYERS

# Bounds of what no tensor sizes for the normalizer (see limits.py for layers, experts and positions).
MAX_HEADS = 1 << 16
MAX_WIDTH = 1 << 20  # hidden, head and feed-forward sizes: the widest published models are below 1 << 17
MAX_VOCAB = 1 << 24

_LAYER_TYPES = ("full_attention", "sliding_attention")
_DEFAULT_THETA = {"gemma3": 1e6, "mixtral": 1e6}  # transformers' defaults where a config names no theta
_GEMMA3_LOCAL_THETA = 10000.0
_PHI3_ORIGINAL_CONTEXT = 4096  # Phi3Config's default: phi3 keeps its original context at the top level
_ROPE_COMMON = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
_ROPE_TOP_LEVEL = frozenset({"rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor"})
_ROPE_WORD = re.compile(r"(^|_)(rope|rotary)(_|$)")  # a top-level key about RoPE
_ROPE_KEYS = {  # per rope type, the other keys transformers reads from a block (modeling_rope_utils)
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                       "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
    "longrope": frozenset({"short_factor", "long_factor", "factor", "original_max_position_embeddings",
                           "attention_factor"}),
}
_WHY_NOT = {"dynamic": "; dynamic NTK recomputes theta from the sequence length, which UAII's RoPE does not",
            "proportional": "; proportional RoPE (gemma4) spreads frequencies over the whole head"}

_Block = tuple[str, dict[str, Any]]  # (where in config.json, settings)


# --- sizes --------------------------------------------------------------------------------------------------
def _size(c: _Src, key: str, most: int, default: int | None = None, least: int = 1) -> int:
    """An integer setting within [least, most] (``default`` when absent, unchecked)."""
    if c.raw(key) is None and default is not None:
        return default
    v = c.int(key, default)
    if v < least:
        raise LoaderError(f"{c.where}: {key!r} must be at least {least}, found {v}")
    if v > most:
        raise LoaderError(f"{c.where}: {key} = {v} is more than the {most} that any model has: the value is "
                          "corrupt")
    return v


def _experts(c: _Src) -> int:
    """``num_local_experts`` (mixtral, transformers 5) or ``num_experts`` (4.x qwen-moe); both must agree."""
    local, old = c.raw("num_local_experts"), c.raw("num_experts")
    if local is not None and old is not None and local != old:
        raise LoaderError(f"{c.where}: 'num_local_experts' = {local!r} but 'num_experts' = {old!r}")
    key = "num_local_experts" if local is not None or old is None else "num_experts"
    return _size(c, key, MAX_EXPERTS)


def language_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's settings: ``text_config`` of a multimodal wrapper (gemma3), with the wrapper's
    token ids and tying; the config itself otherwise."""
    text = config.get("text_config")
    if not isinstance(text, dict) or "hidden_size" in config or "n_embd" in config:
        return config
    keep = {k: v for k, v in config.items() if k in ("tie_word_embeddings", "bos_token_id", "eos_token_id")}
    return {**keep, **text, "model_type": text.get("model_type") or config.get("model_type", "")}


@dataclass(frozen=True)
class Sizes:
    """The sizes every architecture has (bounded), and the config.json keys that spell them."""

    d_model: int
    n_heads: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    context: int
    keys: Mapping[str, str]


_KEYS = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
         "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "d_ff": "intermediate_size",
         "context": "max_position_embeddings"}
_GPT2_KEYS = {"d_model": "n_embd", "n_heads": "n_head", "n_layers": "n_layer", "n_kv_heads": "n_head",
              "head_dim": "n_embd / n_head", "d_ff": "n_inner", "context": "n_positions"}


def sizes(c: _Src, arch: str) -> Sizes:
    """Width, heads, layers, KV heads, head size, feed-forward size and context, each bounded, with
    transformers' defaults (GPT-2: ``n_inner`` 4 x width, ``n_positions`` 1024)."""
    k = _GPT2_KEYS if arch == "gpt2" else _KEYS
    d, n_heads = _size(c, k["d_model"], MAX_WIDTH), _size(c, k["n_heads"], MAX_HEADS)
    n_layers = _size(c, k["n_layers"], MAX_LAYERS)
    if arch == "gpt2":
        return Sizes(d, n_heads, n_layers, n_heads, d // n_heads, _size(c, "n_inner", MAX_WIDTH, 4 * d),
                     _size(c, "n_positions", MAX_CONTEXT, 1024), k)
    return Sizes(d, n_heads, n_layers, _size(c, k["n_kv_heads"], MAX_HEADS, n_heads),
                 _size(c, "head_dim", MAX_WIDTH, d // n_heads), _size(c, k["d_ff"], MAX_WIDTH, 0, least=0),
                 _size(c, k["context"], MAX_CONTEXT, 0, least=0), k)


# --- RoPE: both generations to one set of blocks ------------------------------------------------------------
def _dict_or_none(c: _Src, key: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise LoaderError(f"{c.where}: {key!r} must be a JSON object, found {value!r}")
    return dict(value)


def _merge(c: _Src, block: _Block, key: str, value: Any, origin: str) -> None:
    """Put a transformers 4 setting into a block; one already there must say the same."""
    if value is None:
        return
    label, settings = block
    old = settings.get(key)
    if old is not None and old != value:
        raise LoaderError(f"{c.where}: {key!r} = {value!r} {origin} but {old!r} in {label}")
    settings[key] = value


def _rope_blocks(c: _Src, arch: str) -> dict[str, _Block]:
    """RoPE settings per attention type, in transformers 5's shape, whichever generation wrote the file."""
    params = _dict_or_none(c, "rope_parameters", c.raw("rope_parameters"))
    blocks: dict[str, _Block] = {}
    if params is not None and any(k in _LAYER_TYPES for k in params):
        stray = sorted(k for k in params if k not in _LAYER_TYPES)
        if stray:
            raise LoaderError(f"{c.where}: rope_parameters mixes blocks per attention type "
                              f"({', '.join(k for k in params if k in _LAYER_TYPES)}) with settings "
                              f"({', '.join(map(repr, stray))})")
        for kind, block in params.items():
            label = f"rope_parameters.{kind}"
            blocks[kind] = (label, _dict_or_none(c, label, block) or {})
    elif params is not None and arch == "gemma3":
        raise LoaderError(f"{c.where}: gemma3 needs one rope_parameters block per attention type "
                          f"({', '.join(_LAYER_TYPES)}), found one block {params!r}")
    elif params is not None:
        blocks["full_attention"] = ("rope_parameters", params)
    full = blocks.setdefault("full_attention", ("rope_scaling", {}))
    for key, value in (_dict_or_none(c, "rope_scaling", c.raw("rope_scaling")) or {}).items():
        _merge(c, full, key, value, "in rope_scaling")
    _merge(c, full, "rope_theta", c.raw("rope_theta"), "at the top level")
    if arch == "gemma3":
        sliding = blocks.setdefault("sliding_attention", ("rope_parameters.sliding_attention", {}))
        _merge(c, sliding, "rope_theta", c.raw("rope_local_base_freq"), "as rope_local_base_freq")
    for block in blocks.values():
        _merge(c, block, "partial_rotary_factor", c.raw("partial_rotary_factor"), "at the top level")
    return blocks


def _rope_type(s: _Src, arch: str) -> str:
    new, old = s.raw("rope_type"), s.raw("type")
    if new is not None and old is not None and new != old:
        raise LoaderError(f"{s.where}: 'rope_type' is {new!r} but 'type' is {old!r}")
    kind = str(new if new is not None else old if old is not None else "default")
    if arch == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"  # Phi3Config renames both, in transformers 4 and 5
    if kind not in _ROPE_KEYS:
        raise LoaderError(f"{s.where}: rope scaling {kind!r} is not supported ({', '.join(_ROPE_KEYS)})"
                          + _WHY_NOT.get(kind, ""))
    unknown = sorted(set(s.data) - _ROPE_COMMON - _ROPE_KEYS[kind])
    if unknown:
        accepted = ", ".join(sorted(_ROPE_COMMON | _ROPE_KEYS[kind]))
        raise LoaderError(f"{s.where}: unknown key {unknown[0]!r} for rope type {kind!r} (a {kind} block holds "
                          f"{accepted})")
    return kind


def _need(s: _Src, key: str, kind: str) -> float:
    if s.raw(key) is None:
        raise LoaderError(f"{s.where}: rope type {kind!r} needs {key!r}")
    return s.float(key, 0.0)


def _original_context(s: _Src, ctx: int) -> int:
    orig = _size(s, "original_max_position_embeddings", MAX_CONTEXT, 0, least=0) or ctx
    if orig <= 0:
        raise LoaderError(f"{s.where}: scaled RoPE needs 'original_max_position_embeddings' (or "
                          "max_position_embeddings)")
    return orig


def _mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def _scaled(rope: RopeConfig, s: _Src, kind: str, ctx: int) -> RopeConfig:
    """Fill in the scaling of one block, with transformers' defaults (modeling_rope_utils)."""
    if kind == "linear":
        return replace(rope, scaling="linear", factor=_need(s, "factor", kind))
    orig = _original_context(s, ctx)
    if kind == "llama3":
        return replace(rope, scaling="llama3", factor=_need(s, "factor", kind), original_context=orig,
                       low_freq_factor=_need(s, "low_freq_factor", kind),
                       high_freq_factor=_need(s, "high_freq_factor", kind))
    factor = s.float("factor", ctx / orig)
    if kind == "yarn":
        if s.raw("truncate") not in (None, True):
            raise LoaderError(f"{s.where}: yarn with 'truncate': false is not supported (UAII's RoPE rounds the "
                              "correction range outwards, transformers' default)")
        mscale, mscale_all = s.float("mscale", 0.0), s.float("mscale_all_dim", 0.0)
        attn = _mscale(factor, mscale) / _mscale(factor, mscale_all) if mscale and mscale_all else \
            _mscale(factor, 1.0)
        return replace(rope, scaling="yarn", factor=factor, original_context=orig,
                       attn_factor=s.float("attention_factor", attn),
                       beta_fast=s.float("beta_fast", 0.0) or 32.0, beta_slow=s.float("beta_slow", 0.0) or 1.0)
    attn = math.sqrt(1 + math.log(factor) / math.log(orig)) if factor > 1 and orig > 1 else 1.0
    return replace(rope, scaling="longrope", factor=factor, original_context=orig,
                   attn_factor=s.float("attention_factor", attn),
                   short_factors=_factors(s, "short_factor"), long_factors=_factors(s, "long_factor"))


def _factors(s: _Src, key: str) -> tuple[float, ...]:
    v = s.raw(key)
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                          and math.isfinite(x) for x in v):
        raise LoaderError(f"{s.where}: longrope needs {key!r} as a list of numbers, found {str(v)[:80]}")
    return tuple(float(x) for x in v)


def _rope_of(c: _Src, block: _Block, arch: str, head_dim: int, ctx: int, theta: float) -> RopeConfig:
    label, settings = block
    s = _Src(settings, f"{c.where} {label}")
    kind = _rope_type(s, arch)
    if kind in ("llama3", "yarn", "longrope"):  # phi3 keeps the original context at the top level
        key = "original_max_position_embeddings"
        top, origin = c.raw(key), "at the top level"
        if top is None and arch == "phi3":
            top, origin = _PHI3_ORIGINAL_CONTEXT, "by Phi3Config's default"
        _merge(c, block, key, top, origin)
    dims = int(head_dim * s.float("partial_rotary_factor", 1.0))
    rope = RopeConfig(theta=s.float("rope_theta", theta), dims=dims - dims % 2, mode="neox")
    return rope if kind == "default" else _scaled(rope, s, kind, ctx)


def _hf_rope(c: _Src, arch: str, head_dim: int, ctx: int) -> RopeConfig | None:
    if arch in _ROPELESS:
        return None
    known = _ROPE_TOP_LEVEL | ({"rope_local_base_freq"} if arch == "gemma3" else set())
    unknown = sorted(k for k in c.data if _ROPE_WORD.search(k) and k not in known)
    if unknown:  # e.g. rope_interleave: adjacent pairs instead of halves; ignoring it would rotate wrongly
        raise LoaderError(f"{c.where}: unknown RoPE setting {unknown[0]!r} for {arch} (understood: "
                          f"{', '.join(sorted(known))})")
    blocks = _rope_blocks(c, arch)
    theta = _DEFAULT_THETA.get(arch, 10000.0)
    ropes = {kind: _rope_of(c, block, arch, head_dim, ctx,
                            _GEMMA3_LOCAL_THETA if arch == "gemma3" and kind == "sliding_attention" else theta)
             for kind, block in blocks.items()}
    rope = ropes["full_attention"]
    if arch == "gemma3":  # sliding-window layers: their own theta, no scaling (what transformers 4 could say)
        local = ropes["sliding_attention"]
        if local.scaling != "none" or local.dims != rope.dims:
            raise LoaderError(f"{c.where} {blocks['sliding_attention'][0]}: sliding-window layers take plain RoPE "
                              f"over the full_attention dims in UAII; found {local.scaling!r} over {local.dims}")
        return replace(rope, local_theta=local.theta)
    differ = [kind for kind, r in ropes.items() if r != rope]
    if differ:
        raise LoaderError(f"{c.where}: {arch} layers take one RoPE; rope_parameters differ between "
                          f"full_attention and {', '.join(differ)}")
    return rope


# --- the rest of the config ---------------------------------------------------------------------------------
def _eos(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    vals = v if isinstance(v, list) else [v]
    return tuple(int(x) for x in vals if isinstance(x, int) and not isinstance(x, bool))


def _hf_sliding(c: _Src, arch: str, n_layers: int) -> tuple[int, tuple[bool, ...]]:
    window = _size(c, "sliding_window", MAX_CONTEXT, 0, least=0)
    types = c.raw("layer_types")
    if arch in ("qwen2", "qwen3", "qwen2moe", "qwen3moe") and not c.bool("use_sliding_window", False):
        return 0, ()
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            found = f"{len(types)} layer_types" if isinstance(types, list) else f"layer_types {types!r}"
            raise LoaderError(f"{c.where}: {found} for {n_layers} layers")
        flags = tuple(t == "sliding_attention" for t in types)
    elif arch == "gemma3":
        period = _size(c, "sliding_window_pattern", MAX_LAYERS,
                       _size(c, "_sliding_window_pattern", MAX_LAYERS, _GEMMA3_SWA_PERIOD))
        flags = tuple((i + 1) % period != 0 for i in range(n_layers))
    else:
        flags = (True,) * n_layers
    if not window or not any(flags):
        return 0, ()
    return window, flags


def hf_architecture(config: Mapping[str, Any], where: str = "config.json") -> str:
    """The UAII architecture of a ``config.json`` (of its language model for a multimodal wrapper); an unknown
    ``model_type`` is an error. The loader needs it before :func:`from_hf`: the tensor names map per
    architecture, and the config's sizes are checked against the mapped tensors before anything is sized."""
    model_type = str(language_config(config).get("model_type", ""))
    arch = HF_MODEL_TYPES.get(model_type)
    if arch is None:
        raise unknown_architecture(model_type or "<missing model_type>", where)
    return arch


def from_hf(config: Mapping[str, Any], where: str = "config.json") -> ModelConfig:
    """Normalize a Hugging Face ``config.json`` of transformers 4 or 5 (text config of multimodal models
    included)."""
    arch = hf_architecture(config, where)
    config = language_config(config)
    c = _Src(config, where)
    s = sizes(c, arch)
    n_layers, head_dim, ctx = s.n_layers, s.head_dim, s.context
    eps = c.float("layer_norm_epsilon", 1e-5) if arch == "gpt2" else \
        c.float("rms_norm_eps", c.float("layer_norm_eps", 1e-6))
    act = str(c.raw("hidden_activation") or c.raw("hidden_act") or c.raw("activation_function") or "silu")
    window, flags = _hf_sliding(c, arch, n_layers)
    bos = c.raw("bos_token_id")
    cfg = ModelConfig(
        architecture=arch, source="hf", n_layers=n_layers, d_model=s.d_model, n_heads=s.n_heads,
        n_kv_heads=s.n_kv_heads, head_dim=head_dim, d_ff=s.d_ff, vocab_size=_size(c, "vocab_size", MAX_VOCAB),
        context_length=ctx,
        norm_eps=eps, rope=_hf_rope(c, arch, head_dim, ctx),
        activation="silu" if act in ("silu", "swish") else "gelu" if act == "gelu" else "gelu_tanh",
        sliding_window=window, sliding_layers=flags,
        tied_embeddings=c.bool("tie_word_embeddings", arch in ("gemma3", "gpt2", "bert")),
        qkv_bias=arch == "qwen2" or c.bool("qkv_bias", False) or c.bool("attention_bias", False),
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else -1,
        eos_token_ids=_eos(c.raw("eos_token_id")),
    )
    return _check(_hf_specifics(cfg, c), where)


def _hf_specifics(cfg: ModelConfig, c: _Src) -> ModelConfig:
    arch = cfg.architecture
    if arch == "gemma3":
        if c.bool("use_bidirectional_attention", False):
            raise LoaderError(f"{c.where}: use_bidirectional_attention = true (an embedding model) is not "
                              "supported; gemma3 is built as a causal decoder")
        scalar = c.float("query_pre_attn_scalar", float(cfg.head_dim))
        cfg = cfg.with_(embedding_scale=math.sqrt(cfg.d_model), norm_unit_offset=True,
                        attn_scale=scalar ** -0.5, attn_softcap=c.float("attn_logit_softcapping", 0.0),
                        final_softcap=c.float("final_logit_softcapping", 0.0))
    if arch == "bert":
        kind = c.raw("position_embedding_type")
        if kind not in (None, "absolute"):
            raise LoaderError(f"{c.where}: position_embedding_type {kind!r} is not supported (absolute)")
        cfg = cfg.with_(causal=False, type_vocab_size=c.int("type_vocab_size", 2), pooling="pooler")
    if arch == "mixtral":
        cfg = cfg.with_(n_experts=_experts(c), n_experts_used=c.int("num_experts_per_tok"),
                        d_ff_expert=cfg.d_ff, norm_topk_prob=True)
    if arch in ("qwen2moe", "qwen3moe"):
        step = c.int("decoder_sparse_step", 1) or 1
        only = c.raw("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in only):
            raise LoaderError(f"{c.where}: 'mlp_only_layers' must be a list of layer numbers, found {only!r:.80}")
        dense = tuple(i for i in range(cfg.n_layers) if i in only or (i + 1) % step != 0)
        cfg = cfg.with_(n_experts=_experts(c), n_experts_used=c.int("num_experts_per_tok"),
                        d_ff_expert=_size(c, "moe_intermediate_size", MAX_WIDTH),
                        d_ff_shared=_size(c, "shared_expert_intermediate_size", MAX_WIDTH, 0, least=0)
                        if arch == "qwen2moe" else 0,
                        norm_topk_prob=c.bool("norm_topk_prob", arch == "qwen3moe"), dense_layers=dense)
    return cfg


__all__ = ["MAX_HEADS", "MAX_VOCAB", "MAX_WIDTH", "Sizes", "from_hf", "hf_architecture", "language_config",
           "sizes"]
