"""Writers for the small files the loader tests use: GGUF (with gguf's GGUFWriter) and safetensors (by "
  "hand)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

RNG_SEED = 1234

_ST_DTYPES = {np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("int64"): "I64",
              np.dtype("int32"): "I32", np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("float64"): "F64"}


def safetensors_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file. Values are numpy arrays, or (dtype_label, shape, raw bytes) for e.g. BF16."""
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    pos = 0
    for name, value in tensors.items():
        if isinstance(value, tuple):
            label, shape, raw = value
        else:
            arr = np.ascontiguousarray(value)
            raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
            label, shape = _ST_DTYPES[arr.dtype], list(arr.shape)

        header[name] = {"dtype": label, "shape": list(shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_safetensors(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> Path:
    path.write_bytes(safetensors_bytes(tensors, metadata))
    return path


def write_gguf(path: Path, arch: str = "llama", kv: Mapping[str, Any] | None = None,
               tensors: Mapping[str, Any] | None = None, *, alignment: int | None = None,
               split_max_tensors: int = 0) -> list[Path]:
    """Write a GGUF with GGUFWriter. Tensor values: a float array, or (uint8 bytes array, "
      "GGMLQuantizationType)."""
    import gguf

    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value in (kv or {}).items():
        _add_kv(w, key, value)
    for name, value in (tensors or {}).items():
        if isinstance(value, tuple):
            raw, qtype = value
            w.add_tensor(name, raw, raw_dtype=qtype)
        else:
            w.add_tensor(name, value)
    shards = w.format_shard_names(path)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return shards


def _add_kv(w: Any, key: str, value: Any) -> None:
    import gguf

    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], gguf.GGUFValueType):
        w.add_key_value(key, value[0], value[1])
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, np.ndarray)):
        w.add_array(key, list(value))
    else:
        raise TypeError(f"no GGUF type for {key}={value!r}")


def assert_gguf_table_sound(parsed: Any, data: bytes) -> None:
    """The reader's tensor-table rules, restated for files it accepted (``parse_bytes`` result + the bytes): each
    size is type x shape, and sorted by offset the tensors tile the data section up to zero padding below the
    alignment, the file's end included."""
    from uaii.ir import tensor_nbytes

    align, pos = parsed.alignment, parsed.data_start
    for t in sorted((t for t in parsed.tensors.values() if t.nbytes), key=lambda t: t.offset):
        assert t.nbytes == tensor_nbytes(t.dtype, t.shape) and t.offset % align == 0, t
        assert 0 <= t.offset - pos < align and not any(data[pos:t.offset]), t
        pos = t.end
    assert 0 <= len(data) - pos < align and not any(data[pos:])


def quantize(arr: np.ndarray, qname: str) -> tuple[np.ndarray, Any]:
    import gguf

    qtype = gguf.GGMLQuantizationType[qname]
    return gguf.quants.quantize(arr.astype(np.float32), qtype), qtype


def small_gguf(path: Path, **kw: Any) -> list[Path]:
    """A small, valid GGUF used by the reader and fuzz tests: f32, f16, Q8_0 tensors and a few kinds of KV."""
    rng = np.random.default_rng(RNG_SEED)
    tensors = {
        "token_embd.weight": rng.standard_normal((16, 32), dtype=np.float32),
        "blk.0.attn_norm.weight": np.ones(32, dtype=np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((32, 32)).astype(np.float16),
        "blk.0.ffn_up.weight": quantize(rng.standard_normal((8, 64), dtype=np.float32), "Q8_0"),
    }
    kv = {"llama.block_count": 1, "llama.embedding_length": 32, "general.name": "tiny",
          "tokenizer.ggml.tokens": [f"t{i}" for i in range(16)], "tokenizer.ggml.scores": [0.5] * 16,
          "llama.rope.freq_base": 10000.0, "general.flag": True}
    return write_gguf(path, "llama", kv, tensors, **kw)


# --- tiny Hugging Face models of every architecture (random weights, fixed seed) -----------------------------------
_COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**_COMMON, "rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_COMMON, "sliding_window": 16}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**_COMMON, "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_COMMON, "head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {**_COMMON, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"], "num_key_value_heads": 1}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_COMMON, "num_key_value_heads": 4, "partial_rotary_factor": 0.5}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2)),
    "bert": ("BertConfig", "BertModel",
             dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=128, type_vocab_size=2)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {**_COMMON, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                 {**_COMMON, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64}),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 {**_COMMON, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True, "head_dim": 8}),
}


def save_tiny(arch: str, out: Path, max_shard_size: str | None = None, bf16: bool = False, safe: bool = True) -> Path:
    """Save a tiny random model of ``arch`` with transformers' save_pretrained (safetensors, or PyTorch checkpoints
    with ``safe=False``; f32 or bf16)."""
    import torch
    import transformers

    cfg_name, model_name, kwargs = TINY[arch]
    torch.manual_seed(RNG_SEED)
    config = getattr(transformers, cfg_name)(**kwargs)
    model = getattr(transformers, model_name)(config).eval()
    if bf16:
        model = model.to(torch.bfloat16)

    kw: dict[str, Any] = {"safe_serialization": safe}
    if max_shard_size:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(out, **kw)
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}", "model_max_length": 128}))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return out


BERT_TOKENS = np.array([5, 9, 2, 17, 33, 4, 8], np.int64)


def bert_case(d: Path) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The feeds of a Session run of the tiny BERT in ``d`` (BERT_TOKENS, segment 0) and transformers' last hidden
    state and pooled output for them: what a backend's BERT must give."""
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(d, attn_implementation="eager").eval()
    ids = torch.from_numpy(BERT_TOKENS)[None]
    with torch.no_grad():
        want = model(ids, token_type_ids=torch.zeros_like(ids))
    feeds = {"tokens": BERT_TOKENS, "positions": np.arange(len(BERT_TOKENS), dtype=np.int64),
             "token_types": np.zeros(len(BERT_TOKENS), dtype=np.int64)}
    return feeds, want.last_hidden_state[0].numpy(), want.pooler_output.numpy()


# --- a minimal HF → GGUF converter, following llama.cpp's convert_hf_to_gguf conventions -------------------------
GGUF_ARCH = {"mistral": "llama", "mixtral": "llama"}
_PERMUTED = {"llama", "mistral", "mixtral"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Q/K row permutation: rotate-half (neox) pairs → adjacent (normal) pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(theta: float, dim: int, rs: dict[str, Any]) -> np.ndarray:
    import math

    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for freq in 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _hf_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    from uaii.loaders.index import WeightIndex
    from uaii.loaders.safetensors import open_safetensors

    st = open_safetensors(hf_dir)
    index = WeightIndex(hf_dir)
    return {name: index.read_numpy(index.add(info)).copy() for name, info in st.tensors.items()}


def _canonical_tensors(arch: str, hf_dir: Path, cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    from uaii.loaders.names import hf_to_canonical

    out: dict[str, np.ndarray] = {}
    n_head = cfg.get("num_attention_heads") or cfg["n_head"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    for name, arr in _hf_tensors(hf_dir).items():
        mapped = hf_to_canonical(name, arch)
        if mapped is None or (arch == "bert" and mapped[0].startswith("pooler")):
            continue  # llama.cpp drops BERT's pooler
        canon, transposed = mapped
        if transposed:
            arr = np.ascontiguousarray(arr.T)
        if arch in _PERMUTED and canon.endswith("attn_q.weight"):
            arr = _permute(arr, n_head)
        if arch in _PERMUTED and canon.endswith("attn_k.weight"):
            arr = _permute(arr, n_kv)
        if arch == "gemma3" and canon.endswith("norm.weight"):
            arr = arr + 1.0  # llama.cpp stores gemma norms as (1 + w)
        out[canon] = arr
    if arch in ("mixtral", "qwen2moe", "qwen3moe"):  # per-expert tensors → banks
        n_exp = cfg.get("num_local_experts") or cfg["num_experts"]
        for layer in range(cfg["num_hidden_layers"]):
            for proj in ("gate", "up", "down"):
                parts = [out.pop(f"blk.{layer}.ffn_{proj}.{e}.weight") for e in range(n_exp)]
                out[f"blk.{layer}.ffn_{proj}_exps.weight"] = np.stack(parts)
    return out


def _store(arr: np.ndarray, name: str, mode: str) -> Any:
    if arr.ndim < 2 or mode == "f32" or name.startswith(("rope_", "token_types", "position_embd")):
        return arr.astype(np.float32)
    if mode == "f16":
        return arr.astype(np.float16)
    if arr.shape[-1] % 32 == 0 and "norm" not in name:  # a mixed quantized model, as llama-quantize makes
        return quantize(arr, "Q4_0" if "ffn" in name else "Q8_0")
    return arr.astype(np.float16)


def hf_to_gguf(hf_dir: Path, out: Path, arch: str, mode: str = "f32", extra_kv: dict[str, Any] | None = None,
               **write_kw: Any) -> list[Path]:
    """Convert a tiny HF model to GGUF: mode f32, f16, or q (Q8_0/Q4_0 matrices, f16 where blocks do not "
      "fit)."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    g = GGUF_ARCH.get(arch, arch)
    tensors = _canonical_tensors(arch, hf_dir, cfg)
    n_head = cfg.get("num_attention_heads") or cfg["n_head"]
    d = cfg.get("hidden_size") or cfg["n_embd"]
    head_dim = cfg.get("head_dim") or d // n_head
    kv: dict[str, Any] = {
        f"{g}.block_count": cfg.get("num_hidden_layers") or cfg["n_layer"],
        f"{g}.context_length": cfg.get("max_position_embeddings") or cfg["n_positions"],
        f"{g}.embedding_length": d,
        f"{g}.feed_forward_length": cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * d,
        f"{g}.attention.head_count": n_head,
        f"{g}.attention.head_count_kv": cfg.get("num_key_value_heads") or n_head,
        f"{g}.attention.key_length": head_dim,
        f"{g}.attention.value_length": head_dim,
        f"{g}.vocab_size": cfg["vocab_size"],
        "tokenizer.ggml.bos_token_id": cfg.get("bos_token_id") or 1,
        "tokenizer.ggml.eos_token_id": cfg.get("eos_token_id") or 2,
        "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(cfg["vocab_size"])],
    }
    if arch in ("gpt2", "bert"):
        kv[f"{g}.attention.layer_norm_epsilon"] = float(cfg.get("layer_norm_epsilon") or cfg["layer_norm_eps"])
    else:
        kv[f"{g}.attention.layer_norm_rms_epsilon"] = float(cfg["rms_norm_eps"])
        kv[f"{g}.rope.freq_base"] = float(cfg.get("rope_theta", 10000.0))
        kv[f"{g}.rope.dimension_count"] = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    if arch == "bert":
        kv["bert.attention.causal"] = False
        kv["bert.pooling_type"] = 2
    if cfg.get("sliding_window") and arch in ("mistral", "gemma3"):
        kv[f"{g}.attention.sliding_window"] = cfg["sliding_window"]
    if arch == "gemma3":
        kv["gemma3.attention.sliding_window_pattern"] = [t == "sliding_attention" for t in cfg["layer_types"]]
    if "num_local_experts" in cfg or "num_experts" in cfg:
        kv[f"{g}.expert_count"] = cfg.get("num_local_experts") or cfg["num_experts"]
        kv[f"{g}.expert_used_count"] = cfg["num_experts_per_tok"]
        if cfg.get("moe_intermediate_size"):
            kv[f"{g}.expert_feed_forward_length"] = cfg["moe_intermediate_size"]
        if cfg.get("shared_expert_intermediate_size"):
            kv[f"{g}.expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = llama3_rope_freqs(float(cfg["rope_theta"]), head_dim, rs)
    if rs.get("type") == "longrope":  # llama.cpp: factor tensors + the magnitude as attn_factor
        import math

        orig = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / orig
        tensors["rope_factors_long.weight"] = np.asarray(rs["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.asarray(rs["short_factor"], np.float32)
        kv[f"{g}.rope.scaling.attn_factor"] = math.sqrt(1 + math.log(scale) / math.log(orig))
        kv[f"{g}.rope.scaling.original_context_length"] = orig

    kv.update(extra_kv or {})
    stored = {name: _store(arr, name, mode) for name, arr in tensors.items()}
    return write_gguf(out, g, kv, stored, **write_kw)
