"""Tiny models whose ``config.json`` the loader must read as transformers 4.x and 5.x write it.

transformers 5 moved RoPE settings from top-level ``rope_theta`` / ``rope_scaling`` (and gemma3's
``rope_local_base_freq``) into a ``rope_parameters`` block, one block per attention type for gemma3. The same
variant saved by both generations must normalize to the same :class:`~uaii.loaders.config.ModelConfig`; the
checked-in ``fixtures/hf_configs/v4`` and ``v5`` copies are what ``scripts/gen_hf_config_fixtures.py`` saved
with transformers 4.57 and 5.x from :data:`VARIANTS` (weights dropped, only ``config.json`` kept).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loader_helpers import LLAMA3_ROPE, RNG_SEED, TINY

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"
INIT_RANGE = 0.2
GENERATIONS = ("v4", "v5")


def _variant(arch: str, **changes: Any) -> tuple[str, str | None, str, dict[str, Any]]:
    cfg_name, model_name, kwargs = TINY[arch]
    # weights 10x transformers' default scale: sharper attention, so a wrong RoPE moves the logits visibly
    kwargs = {"initializer_range": INIT_RANGE, **kwargs}
    kwargs = {k: v for k, v in {**kwargs, **changes}.items() if v is not None}
    return arch, model_name, cfg_name, kwargs


_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32.0,
         "beta_slow": 1.0}
_GEMMA3_TEXT = {k: v for k, v in TINY["gemma3"][2].items()}

VARIANTS: dict[str, tuple[str, str | None, str, dict[str, Any]]] = {
    # name: (architecture of loader_helpers.TINY, model class or None for config-only, config class, kwargs)
    "llama": _variant("llama", rope_scaling=None),
    "llama_llama3": _variant("llama", rope_scaling=dict(LLAMA3_ROPE)),
    "llama_linear": _variant("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "llama_yarn": _variant("llama", rope_scaling=dict(_YARN), rope_theta=10000.0),
    "llama_dynamic": _variant("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "mistral": _variant("mistral", rope_theta=1e6),
    "qwen2": _variant("qwen2", rope_theta=1e6),
    "qwen2_yarn": _variant("qwen2", rope_scaling={"type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 32}),
    "qwen3": _variant("qwen3", rope_theta=1e6),
    "qwen3_yarn": _variant("qwen3", rope_scaling=dict(_YARN), rope_theta=1e6),
    "gemma3": _variant("gemma3"),
    "gemma3_linear": _variant("gemma3", rope_scaling={"rope_type": "linear", "factor": 8.0},
                              rope_local_base_freq=20000.0),
    "phi3": _variant("phi3"),
    "phi3_longrope": _variant("phi3", max_position_embeddings=512, original_max_position_embeddings=8,
                              rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5],
                                            "long_factor": [2.0, 4.0]}),
    "gpt2": _variant("gpt2"),
    "bert": _variant("bert"),
    "mixtral": _variant("mixtral"),
    "qwen2moe": _variant("qwen2moe", rope_theta=1e6),
    "qwen3moe": _variant("qwen3moe", rope_theta=1e6),
    "gemma3_multimodal": ("gemma3", None, "Gemma3Config", {
        "text_config": {**_GEMMA3_TEXT, "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
        "mm_tokens_per_image": 4}),
}
"""Every architecture, plain and with each RoPE scaling transformers supports for it. ``llama_dynamic`` is
dynamic NTK, which UAII does not implement: both generations of it must be refused."""

REFUSED = frozenset({"llama_dynamic"})


def save_variant(name: str, out: Path) -> Path:
    """Save ``name`` with the installed transformers: the model (fixed seed) or, config-only, its config."""
    import torch
    import transformers

    _, model_name, cfg_name, kwargs = VARIANTS[name]
    config = getattr(transformers, cfg_name)(**json.loads(json.dumps(kwargs)))
    if model_name is None:
        config.save_pretrained(out)
        return out
    torch.manual_seed(RNG_SEED)
    model = getattr(transformers, model_name)(config).eval()
    model.save_pretrained(out, safe_serialization=True)
    return out


def fixture(generation: str, name: str) -> dict[str, Any]:
    """The checked-in ``config.json`` of ``name`` as transformers ``generation`` (v4 | v5) wrote it."""
    data: dict[str, Any] = json.loads((FIXTURES / generation / f"{name}.json").read_text())
    return data
