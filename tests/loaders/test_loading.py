"""load_model: format detection, plugins, config normalization, name mapping, clear errors."""

from __future__ import annotations

import json
import shutil
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import FormatError, UaiiError, validate
from uaii.loaders import (
    LoaderError,
    MissingDependency,
    detect_format,
    from_gguf,
    from_hf,
    load_model,
    loaders,
    supported_architectures,
)
from uaii.loaders import model as model_mod
from uaii.loaders.errors import require
from uaii.loaders.names import hf_to_canonical

gguf = pytest.importorskip("gguf")

LLAMA_KV = {"llama.block_count": 1, "llama.embedding_length": 32, "llama.attention.head_count": 4,
            "llama.feed_forward_length": 64, "llama.context_length": 64}


def _llama_tensors(**extra: Any) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    t: dict[str, Any] = {"token_embd.weight": rng.standard_normal((16, 32), dtype=np.float32),
                         "output_norm.weight": np.ones(32, np.float32),
                         "blk.0.attn_norm.weight": np.ones(32, np.float32),
                         "blk.0.ffn_norm.weight": np.ones(32, np.float32)}
    for n, shape in [("attn_q", (32, 32)), ("attn_k", (32, 32)), ("attn_v", (32, 32)),
                     ("attn_output", (32, 32)), ("ffn_gate", (64, 32)), ("ffn_up", (64, 32)),
                     ("ffn_down", (32, 64))]:
        t[f"blk.0.{n}.weight"] = rng.standard_normal(shape, dtype=np.float32)
    t.update(extra)
    return t


def test_a_handwritten_gguf_loads(tmp_path: Path) -> None:
    p = H.write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV, _llama_tensors())[0]
    m = load_model(p)
    assert validate(m.graph) == [] and m.config.tied_embeddings
    assert detect_format(p) == "gguf" and detect_format(tmp_path) == "gguf"
    meta = m.graph.meta
    for key in ("config.architecture", "config.n_layers", "config.d_model", "config.rope.theta",
                "config.norm_eps", "config.vocab_size", "config.context_length", "config.sliding_layers",
                "config.bos_token_id", "config.eos_token_ids"):
        assert key in meta
    assert meta["config.architecture"] == "llama" and meta["config.vocab_size"] == "16"


def test_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "m.onnx").write_bytes(b"\x08\x01")  # ir_version 1, no graph: the onnx loader says so
    with pytest.raises(FormatError, match=r"m\.onnx: expected an ONNX ModelProto with an ir_version and a graph; "
                                          r"found ir_version 1 and no graph"):
        load_model(tmp_path / "m.onnx")
    (tmp_path / "x.bin").write_bytes(b"junk")
    with pytest.raises(LoaderError, match="PyTorch files have no loader"):
        detect_format(tmp_path / "x.bin")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(LoaderError, match="format not recognized"):
        load_model(tmp_path / "x.txt")
    # unknown architectures list the supported ones
    p = H.write_gguf(tmp_path / "mamba.gguf", "mamba", {}, {"x": np.zeros(4, np.float32)})[0]
    with pytest.raises(LoaderError, match="architecture 'mamba' is not supported; supported: llama, mistral"):
        load_model(p)
    with pytest.raises(LoaderError, match=r"'rwkv' is not supported; supported: .*qwen3moe"):
        from_hf({"model_type": "rwkv"})
    # a missing tensor is named
    tensors = _llama_tensors()
    del tensors["blk.0.attn_k.weight"]
    p = H.write_gguf(tmp_path / "missing.gguf", "llama", LLAMA_KV, tensors)[0]
    with pytest.raises(LoaderError, match=r"missing tensor 'blk\.0\.attn_k\.weight'"):
        load_model(p)


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    raw = np.zeros((16, 66), dtype=np.uint8)  # 16 rows of one IQ2_XXS block (256 values)
    tensors = _llama_tensors(**{"blk.0.extra.weight": (raw, gguf.GGMLQuantizationType.IQ2_XXS)})
    p = H.write_gguf(tmp_path / "iq.gguf", "llama", LLAMA_KV, tensors)[0]
    with pytest.raises(FormatError, match=r"tensor 'blk.0.extra.weight' has type IQ2_XXS, which the kernels "
                                           "do "
                                          r"not support; supported: .*Q4_K"):
        load_model(p)


def test_hf_directory_without_safetensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(LoaderError, match="no weights found"):
        load_model(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK")  # read as a torch.save archive (tests/loaders/test_torch_*)
    with pytest.raises(FormatError, match=r"pytorch_model\.bin: not a readable zip archive"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(FormatError, match=r"config\.json: not valid JSON"):
        load_model(tmp_path)


def test_missing_optional_dependency_names_the_extra() -> None:
    with pytest.raises(MissingDependency) as ei:
        require("uaii_no_such_module", "onnx", "reading ONNX models")
    msg = str(ei.value)
    assert "\n" not in msg and "pip install 'uaii-loaders[onnx]'" in msg and msg.startswith("[loaders]")


def test_loaders_come_from_entry_points(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    names = [ld.name for ld in loaders()]
    assert names == ["onnx", "hf", "gguf"]  # built-ins are entry points too, ordered by priority

    class Plugin:
        name, priority = "toy", 100

        def detect(self, path: Path) -> bool:
            return path.suffix == ".toy"

        def load(self, path: Path, **options: Any) -> Any:
            return ("toy", path)

    real = model_mod.entry_points

    def fake(group: str) -> list[EntryPoint]:
        eps = list(real(group=group))
        if group == "uaii.loaders":
            eps.append(EntryPoint("toy", "tests_toy:LOADER", group))

        return eps

    import sys
    import types
    mod = types.ModuleType("tests_toy")
    mod.LOADER = Plugin()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tests_toy", mod)
    monkeypatch.setattr(model_mod, "entry_points", fake)
    assert [ld.name for ld in loaders()] == ["toy", "onnx", "hf", "gguf"]
    (tmp_path / "m.toy").write_text("x")
    assert load_model(tmp_path / "m.toy") == ("toy", tmp_path / "m.toy")


def test_supported_architectures() -> None:
    assert supported_architectures() == ("bert", "gemma3", "gpt2", "llama", "mistral", "mixtral", "phi3",
                                         "qwen2", "qwen2moe", "qwen3", "qwen3moe")


# --- config normalization ----------------------------------------------------------------------------------------
def test_hf_config_normalization() -> None:
    llama3 = from_hf({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128,
                      "vocab_size": 10, "max_position_embeddings": 1024, "rope_theta": 5e5, "head_dim": None,
                      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
                      "eos_token_id": [5, 6], "bos_token_id": 1})
    assert llama3.head_dim == 16 and llama3.rope is not None and llama3.rope.scaling == "llama3"
    assert llama3.rope.original_context == 256 and llama3.eos_token_ids == (5, 6) and llama3.rope.mode == "neox"
    gemma = from_hf({"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 12,
        "intermediate_size": 128, "vocab_size": 10, "head_dim": 32, "sliding_window": 16,
        "query_pre_attn_scalar": 32, "rope_local_base_freq": 10000.0}})
    assert gemma.architecture == "gemma3" and gemma.norm_unit_offset and gemma.embedding_scale == 8.0
    assert gemma.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(12))
    qwen = from_hf({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                    "vocab_size": 10, "sliding_window": 32, "use_sliding_window": False})
    assert qwen.sliding_window == 0  # qwen declares a window it does not use
    with pytest.raises(LoaderError, match="rope scaling 'dynamic' is not supported"):
        from_hf({**{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                    "num_hidden_layers": 2, "vocab_size": 10}, "rope_scaling": {"type": "dynamic"}})
    with pytest.raises(LoaderError, match="missing required setting 'hidden_size'"):
        from_hf({"model_type": "llama"})


def test_gguf_config_normalization() -> None:
    base = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
            "llama.attention.head_count": 4, "llama.vocab_size": 10}
    assert from_gguf(base).rope.mode == "normal"  # type: ignore[union-attr]
    moe = from_gguf({**base, "llama.expert_count": 8, "llama.expert_used_count": 2})
    assert moe.architecture == "mixtral" and moe.norm_topk_prob
    q2 = from_gguf({**{k.replace("llama", "qwen2moe"): v for k, v in base.items()},
                    "general.architecture": "qwen2moe", "qwen2moe.expert_count": 4,
                    "qwen2moe.expert_used_count": 2})
    assert q2.rope.mode == "neox" and not q2.norm_topk_prob  # type: ignore[union-attr]
    per_layer = {**base, "llama.attention.head_count_kv": np.array([4, 2], dtype=np.int32)}
    with pytest.raises(LoaderError, match="varies per layer"):
        from_gguf(per_layer)
    with pytest.raises(LoaderError, match="not a multiple of 3 KV heads"):
        from_gguf({**base, "llama.attention.head_count_kv": 3})


# --- name mapping (an independent table, not derived from names.py) ------------------------------------------------
@pytest.mark.parametrize("arch, hf, canonical", [
    ("llama", "model.embed_tokens.weight", ("token_embd.weight", False)),
    ("llama", "lm_head.weight", ("output.weight", False)),
    ("llama", "model.norm.weight", ("output_norm.weight", False)),
    ("llama", "model.layers.3.self_attn.o_proj.weight", ("blk.3.attn_output.weight", False)),
    ("llama", "model.layers.3.post_attention_layernorm.weight", ("blk.3.ffn_norm.weight", False)),
    ("qwen2", "model.layers.0.self_attn.q_proj.bias", ("blk.0.attn_q.bias", False)),
    ("qwen3", "model.layers.0.self_attn.k_norm.weight", ("blk.0.attn_k_norm.weight", False)),
    ("gemma3", "model.layers.1.post_attention_layernorm.weight", ("blk.1.post_attention_norm.weight", False)),
    ("gemma3", "model.layers.1.pre_feedforward_layernorm.weight", ("blk.1.ffn_norm.weight", False)),
    ("gemma3", "model.layers.1.post_feedforward_layernorm.weight", ("blk.1.post_ffw_norm.weight", False)),
    ("gemma3", "language_model.model.layers.0.mlp.up_proj.weight", ("blk.0.ffn_up.weight", False)),
    ("gemma3", "model.language_model.embed_tokens.weight", ("token_embd.weight", False)),
    ("phi3", "model.layers.2.self_attn.qkv_proj.weight", ("blk.2.attn_qkv.weight", False)),
    ("phi3", "model.layers.2.mlp.gate_up_proj.weight", ("blk.2.ffn_up.weight", False)),
    ("gpt2", "transformer.h.0.attn.c_attn.weight", ("blk.0.attn_qkv.weight", True)),
    ("gpt2", "transformer.h.0.attn.c_attn.bias", ("blk.0.attn_qkv.bias", False)),
    ("gpt2", "h.1.mlp.c_proj.weight", ("blk.1.ffn_down.weight", True)),
    ("gpt2", "transformer.wpe.weight", ("position_embd.weight", False)),
    ("bert", "bert.encoder.layer.0.attention.output.LayerNorm.gamma", ("blk.0.attn_output_norm.weight", False)),
    ("bert", "embeddings.token_type_embeddings.weight", ("token_types.weight", False)),
    ("bert", "pooler.dense.bias", ("pooler.bias", False)),
    ("mixtral", "model.layers.0.block_sparse_moe.experts.7.w2.weight", ("blk.0.ffn_down.7.weight", False)),
    ("mixtral", "model.layers.0.block_sparse_moe.gate.weight", ("blk.0.ffn_gate_inp.weight", False)),
    ("qwen2moe", "model.layers.0.mlp.shared_expert_gate.weight", ("blk.0.ffn_gate_inp_shexp.weight", False)),
    ("qwen2moe", "model.layers.0.mlp.shared_expert.up_proj.weight", ("blk.0.ffn_up_shexp.weight", False)),
    ("qwen3moe", "model.layers.0.mlp.experts.3.gate_proj.weight", ("blk.0.ffn_gate.3.weight", False)),
    ("gpt2", "transformer.h.0.attn.bias", None),  # a causal-mask buffer, not a weight
    ("llama", "model.layers.0.self_attn.rotary_emb.inv_freq", None),
    ("gemma3", "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", None),
    ("bert", "cls.predictions.bias", None),
])
def test_hf_names(arch: str, hf: str, canonical: tuple[str, bool] | None) -> None:
    assert hf_to_canonical(hf, arch) == canonical


def test_unmapped_hf_tensors_are_reported(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    d = H.save_tiny("llama", tmp_path / "m")
    st = d / "model.safetensors"
    data = st.read_bytes()
    from uaii.loaders.index import WeightIndex
    from uaii.loaders.safetensors import open_file
    sf = open_file(st)
    idx = WeightIndex(d)
    tensors = {n: idx.read_numpy(idx.add(i)) for n, i in sf.tensors.items()}
    tensors["model.layers.0.mystery.weight"] = np.zeros(3, np.float32)
    H.write_safetensors(st, tensors)
    with pytest.raises(LoaderError, match=r"1 tensors have no place in a llama model, e\.g\. "
                                          r"model\.layers\.0\.mystery\.weight"):

        load_model(d)
    st.write_bytes(data)
    assert validate(load_model(d).graph) == []


def test_phi3_longrope(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    d = H.save_tiny("phi3", tmp_path / "phi3")
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(max_position_embeddings=512, original_max_position_embeddings=128,
               rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0]})
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(d)
    g = m.graph
    assert validate(g) == []
    rope = next(n for n in g.nodes if n.op == "RoPE")
    assert rope.inputs[2] == "rope.factors" and list(g.tensor("rope.factors").numpy()) == [2.0, 4.0]
    # the magnitude on the rotated channels: RoPE's yarn with factor 1 leaves frequencies to freq_factors
    assert rope.get("scaling_type") == "yarn" and rope.get("factor") == 1.0
    assert rope.get("attn_factor") == pytest.approx((1 + np.log(4.0) / np.log(128)) ** 0.5)
    shutil.rmtree(d)



def test_uaii_error_root() -> None:
    assert issubclass(LoaderError, UaiiError) and issubclass(MissingDependency, LoaderError)


def test_a_quantized_checkpoint_of_an_unread_scheme_is_named(tmp_path: Path) -> None:
    """MLX's .scales/.biases beside a packed uint32 weight without the config that says how they are packed,
    GPTQ's .qweight/.qzeros: said as such (with the config's bits and group size), instead of "tensors with no
    place in the model"."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    d = H.save_tiny("llama", tmp_path / "mlx")
    cfg = json.loads((d / "config.json").read_text())
    w = np.zeros((32, 32), np.float32)
    tensors = {"model.embed_tokens.weight": np.zeros((64, 32), np.float32),
               "model.layers.0.self_attn.q_proj.weight": ("U32", (32, 4), bytes(32 * 4 * 4)),
               "model.layers.0.self_attn.q_proj.scales": w[:, :1].copy(),
               "model.layers.0.self_attn.q_proj.biases": w[:, :1].copy()}
    (d / "model.safetensors").unlink()
    H.write_safetensors(d / "model.safetensors", tensors, {"format": "mlx"})
    with pytest.raises(LoaderError, match=r"q_proj.biases' is an MLX quantization parameter, but config.json has no "
                                          r"\"quantization\""):
        load_model(d)
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (d / "config.json").write_text(json.dumps(cfg))
    gptq = {"model.layers.0.self_attn.q_proj.qweight": np.zeros((4, 32), np.int32),
            "model.layers.0.self_attn.q_proj.qzeros": np.zeros((1, 4), np.int32)}
    H.write_safetensors(d / "model.safetensors", gptq)
    with pytest.raises(LoaderError, match=r"GPTQ/AWQ-quantized checkpoint \(quant_method gptq, bits 4, "
                                          r"group_size 128\)"):
        load_model(d)
