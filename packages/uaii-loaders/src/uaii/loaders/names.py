"""One canonical tensor layout for every format: GGUF's names.

Builders address weights by the names llama.cpp gives them (``token_embd.weight``, ``blk.3.attn_q.weight``,
``blk.3.ffn_gate_exps.weight``). GGUF files already use them; Hugging Face names are mapped here, per
architecture family. Per-expert HF tensors get ``blk.N.ffn_gate.E.weight`` (the pre-bank GGUF spelling), so a
builder finds an expert either in a bank (``ffn_gate_exps``, split into ``#e=E`` references) or as its own
tensor.

GPT-2 checkpoints store linear weights as ``Conv1D`` (``[in, out]``); :func:`hf_to_canonical` reports them as
transposed so the builder sets the MatMul's ``transpose_b`` accordingly. Every other weight is ``[out, in]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Prefixes that wrap the language model in HF checkpoints (task heads, multimodal wrappers).
_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "transformer.", "bert.",
             "model.")
_SKIP = re.compile(r"(^|\.)(vision_tower|multi_modal_projector|vision_model|visual|cls|classifier|"
                   r"qa_outputs)\.|"

                   r"(^|\.)(rotary_emb\.inv_freq|attn\.bias|attn\.masked_bias|position_ids)$")


_COMMON: list[tuple[str, str]] = [
    (r"embed_tokens", "token_embd"),
    (r"norm", "output_norm"),
    (r"lm_head", "output"),
    (r"layers\.(\d+)\.input_layernorm", r"blk.\1.attn_norm"),
    (r"layers\.(\d+)\.self_attn\.q_proj", r"blk.\1.attn_q"),
    (r"layers\.(\d+)\.self_attn\.k_proj", r"blk.\1.attn_k"),
    (r"layers\.(\d+)\.self_attn\.v_proj", r"blk.\1.attn_v"),
    (r"layers\.(\d+)\.self_attn\.o_proj", r"blk.\1.attn_output"),
    (r"layers\.(\d+)\.self_attn\.qkv_proj", r"blk.\1.attn_qkv"),
    (r"layers\.(\d+)\.self_attn\.q_norm", r"blk.\1.attn_q_norm"),
    (r"layers\.(\d+)\.self_attn\.k_norm", r"blk.\1.attn_k_norm"),
    (r"layers\.(\d+)\.post_attention_layernorm", r"blk.\1.ffn_norm"),
    (r"layers\.(\d+)\.mlp\.gate_proj", r"blk.\1.ffn_gate"),
    (r"layers\.(\d+)\.mlp\.up_proj", r"blk.\1.ffn_up"),
    (r"layers\.(\d+)\.mlp\.down_proj", r"blk.\1.ffn_down"),
    (r"layers\.(\d+)\.mlp\.gate_up_proj", r"blk.\1.ffn_up"),  # phi3: fused [gate; up], GGUF calls it ffn_up
    # mixtral
    (r"layers\.(\d+)\.block_sparse_moe\.gate", r"blk.\1.ffn_gate_inp"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w1", r"blk.\1.ffn_gate.\2"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w2", r"blk.\1.ffn_down.\2"),
    (r"layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w3", r"blk.\1.ffn_up.\2"),
    # qwen2-moe / qwen3-moe
    (r"layers\.(\d+)\.mlp\.gate", r"blk.\1.ffn_gate_inp"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.gate_proj", r"blk.\1.ffn_gate.\2"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.up_proj", r"blk.\1.ffn_up.\2"),
    (r"layers\.(\d+)\.mlp\.experts\.(\d+)\.down_proj", r"blk.\1.ffn_down.\2"),
    (r"layers\.(\d+)\.mlp\.shared_expert\.gate_proj", r"blk.\1.ffn_gate_shexp"),
    (r"layers\.(\d+)\.mlp\.shared_expert\.up_proj", r"blk.\1.ffn_up_shexp"),
    (r"layers\.(\d+)\.mlp\.shared_expert\.down_proj", r"blk.\1.ffn_down_shexp"),
    (r"layers\.(\d+)\.mlp\.shared_expert_gate", r"blk.\1.ffn_gate_inp_shexp"),
    # mlx-lm's stacked experts (SwitchGLU): one [experts, rows, cols] bank per projection
    (r"layers\.(\d+)\.(?:mlp|block_sparse_moe)\.switch_mlp\.gate_proj", r"blk.\1.ffn_gate_exps"),
    (r"layers\.(\d+)\.(?:mlp|block_sparse_moe)\.switch_mlp\.up_proj", r"blk.\1.ffn_up_exps"),
    (r"layers\.(\d+)\.(?:mlp|block_sparse_moe)\.switch_mlp\.down_proj", r"blk.\1.ffn_down_exps"),
]

_GEMMA3: list[tuple[str, str]] = [
    (r"layers\.(\d+)\.post_attention_layernorm", r"blk.\1.post_attention_norm"),
    (r"layers\.(\d+)\.pre_feedforward_layernorm", r"blk.\1.ffn_norm"),
    (r"layers\.(\d+)\.post_feedforward_layernorm", r"blk.\1.post_ffw_norm"),
]

_GPT2: list[tuple[str, str]] = [
    (r"wte", "token_embd"),
    (r"wpe", "position_embd"),
    (r"ln_f", "output_norm"),
    (r"lm_head", "output"),
    (r"h\.(\d+)\.ln_1", r"blk.\1.attn_norm"),
    (r"h\.(\d+)\.attn\.c_attn", r"blk.\1.attn_qkv"),
    (r"h\.(\d+)\.attn\.c_proj", r"blk.\1.attn_output"),
    (r"h\.(\d+)\.ln_2", r"blk.\1.ffn_norm"),
    (r"h\.(\d+)\.mlp\.c_fc", r"blk.\1.ffn_up"),
    (r"h\.(\d+)\.mlp\.c_proj", r"blk.\1.ffn_down"),
]
_GPT2_CONV1D = re.compile(r"^blk\.\d+\.(attn_qkv|attn_output|ffn_up|ffn_down)\.weight$")

_BERT: list[tuple[str, str]] = [
    (r"embeddings\.word_embeddings", "token_embd"),
    (r"embeddings\.position_embeddings", "position_embd"),
    (r"embeddings\.token_type_embeddings", "token_types"),
    (r"embeddings\.LayerNorm", "token_embd_norm"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.query", r"blk.\1.attn_q"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.key", r"blk.\1.attn_k"),
    (r"encoder\.layer\.(\d+)\.attention\.self\.value", r"blk.\1.attn_v"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense", r"blk.\1.attn_output"),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm", r"blk.\1.attn_output_norm"),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense", r"blk.\1.ffn_up"),
    (r"encoder\.layer\.(\d+)\.output\.dense", r"blk.\1.ffn_down"),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm", r"blk.\1.layer_output_norm"),
    (r"pooler\.dense", "pooler"),
]


def _compile(table: list[tuple[str, str]]) -> list[tuple[re.Pattern[str], str]]:
    # scales / biases: an MLX-quantized module's parameters beside its packed weight (uaii.loaders.mlx)
    return [(re.compile(rf"^{pat}\.(weight|bias|gamma|beta|scales|biases)$"), rep) for pat, rep in table]


_TABLES = {
    "gpt2": _compile(_GPT2),
    "bert": _compile(_BERT),
    "gemma3": _compile(_GEMMA3 + _COMMON),
}
_DEFAULT = _compile(_COMMON)
_SUFFIX = {"gamma": "weight", "beta": "bias"}


def _strip(name: str) -> str:
    for p in _PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def hf_to_canonical(name: str, arch: str) -> tuple[str, bool] | None:
    """Canonical name of an HF tensor and whether it is stored transposed (``[in, out]``); None to ignore "
      "it."""
    if _SKIP.search(name):
        return None
    short = _strip(name)
    for pat, rep in _TABLES.get(arch, _DEFAULT):
        m = pat.match(short)
        if m is not None:
            suffix = m.group(m.lastindex or 0)
            stem = m.expand(rep)
            canon = f"{stem}.{_SUFFIX.get(suffix, suffix)}"
            return canon, arch == "gpt2" and bool(_GPT2_CONV1D.match(canon))
    return None


def unmapped(names: Iterable[str], arch: str) -> list[str]:
    """HF tensor names that neither map nor are deliberately ignored (reported, never silently dropped)."""
    return [n for n in names if hf_to_canonical(n, arch) is None and not _SKIP.search(n)]


# --- reading canonical names --------------------------------------------------------------------------------
# What the loaders read back from canonical names: the weight set (banks to split) and both count checks
# (gguf_counts, hf_counts), which compare the tensors a file holds with the counts its config states.
LAYER = re.compile(r"^blk\.(\d+)\.")
"""Any tensor of a layer; group 1 is the layer number."""
BANK = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.weight$")
"""A packed expert bank ``[experts, rows, cols]``."""
BANK_PART = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.(weight|scales|biases)$")
"""A bank, or the per-expert scales / biases of an MLX-quantized one: each is split into experts (``#e=N``)."""
EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")
"""One expert's own tensor (HF checkpoints, old GGUFs); groups: layer, projection, expert."""


def layer_numbers(names: Iterable[str]) -> list[int]:
    """The layers that hold at least one tensor, ascending."""
    return sorted({int(m.group(1)) for name in names if (m := LAYER.match(name))})


def experts_per_projection(names: Iterable[str]) -> dict[tuple[str, str], int]:
    """(layer, projection) -> 1 + the highest expert number among the per-expert tensors, in the order the
    names first show them. The layer is kept as written: the builder looks experts up under ``blk.{n}``, so
    ``blk.01.ffn_up.0.weight`` is not an expert of layer 1 and must not be counted as one."""
    per: dict[tuple[str, str], int] = {}
    for name in names:
        if m := EXPERT.match(name):
            key = (m.group(1), m.group(2))
            per[key] = max(per.get(key, 0), int(m.group(3)) + 1)
    return per


__all__ = ["BANK", "BANK_PART", "EXPERT", "LAYER", "experts_per_projection", "hf_to_canonical", "layer_numbers",
           "unmapped"]
