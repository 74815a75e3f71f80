"""Every architecture: a tiny random model saved by transformers, and its GGUF conversion (f32, f16, quantized),
load into IR graphs that pass the validator with zero diagnostics and agree with each other."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import DType, Graph, Node, tensor_nbytes, validate
from uaii.loaders import LoadedModel, load_model, open_safetensors, supported_architectures
from uaii.loaders.gguf import cross_check

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

ARCHS = sorted(H.TINY)
MODES = ("f32", "f16", "q")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch → HF directory, and 'arch-mode' → GGUF file, built once per session."""
    root = tmp_path_factory.mktemp("tiny")
    out: dict[str, Path] = {}
    for arch in ARCHS:
        out[arch] = H.save_tiny(arch, root / arch)
        for mode in MODES:
            out[f"{arch}-{mode}"] = H.hf_to_gguf(out[arch], root / f"{arch}-{mode}.gguf", arch, mode)[0]
    return out


def _nodes(g: Graph, op: str) -> list[Node]:
    return [n for n in g.nodes if n.op == op]


def _check_model(m: LoadedModel, arch: str) -> None:
    assert validate(m.graph) == [], validate(m.graph)[:3]
    cfg = m.config
    assert cfg.n_layers == 2 and cfg.d_model == 32 and cfg.vocab_size == 64
    meta = m.graph.meta
    assert meta["config.n_layers"] == "2" and meta["config.d_model"] == "32"
    # every weight of the graph resolves to exactly dtype x shape bytes inside its file
    for t in m.graph.weights:
        assert t.weight is not None
        key = str(t.weight)
        if key in m.weights.virtual_banks:
            parts = m.weights.experts(key)
            assert len(parts) == t.shape[0]
            assert all(p.nbytes == tensor_nbytes(t.dtype, t.shape[1:]) for p in parts)
            continue
        info = m.weights[key]
        assert info.dtype == t.dtype and info.nbytes == tensor_nbytes(info.dtype, info.shape)
        assert info.end <= Path(info.file).stat().st_size
    assert cfg.architecture == arch or (arch == "mistral" and m.format == "gguf")


def test_every_listed_architecture_has_a_tiny_model() -> None:
    assert set(supported_architectures()) == set(ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_directory(tiny: dict[str, Path], arch: str) -> None:
    m = load_model(tiny[arch])
    assert m.format == "hf" and m.base_dir == tiny[arch].resolve()
    _check_model(m, arch)
    assert {"tokenizer_config", "special_tokens_map"} <= set(m.tokenizer_files)
    assert m.chat_template == "{{ messages }}"
    refs = {str(t.weight) for t in m.graph.weights}
    assert all(r.startswith("model.safetensors#") for r in refs)
    # nothing in the checkpoint is silently dropped: every tensor is used by the graph
    used = {m.weights[r].name for r in refs if r not in m.weights.virtual_banks}
    used |= {p.name for r in m.weights.virtual_banks for p in m.weights.experts(r)}
    assert set(open_safetensors(tiny[arch]).tensors) == used



@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_conversion(tiny: dict[str, Path], arch: str, mode: str) -> None:
    hf = load_model(tiny[arch])
    m = load_model(tiny[f"{arch}-{mode}"])
    assert m.format == "gguf" and m.tokenizer_files == {"gguf": tiny[f"{arch}-{mode}"].resolve()}
    assert cross_check(tiny[f"{arch}-{mode}"]) == []  # gguf.GGUFReader reads the same file the same way
    _check_model(m, arch)
    same = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "vocab_size", "norm_eps",
            "sliding_window", "sliding_layers", "n_experts", "n_experts_used", "tied_embeddings", "qkv_bias")
    assert {k: getattr(m.config, k) for k in same} == {k: getattr(hf.config, k) for k in same}
    ops_hf, ops_gguf = Counter(n.op for n in hf.graph.nodes), Counter(n.op for n in m.graph.nodes)
    ops_gguf.pop("Cast", None)
    ops_hf.pop("Cast", None)
    if arch == "bert":  # llama.cpp drops the pooler: cls pooling instead of tanh(dense(h[0]))
        ops_hf -= Counter({"MatMul": 1, "Add": 1, "Tanh": 1})
    assert ops_gguf == ops_hf
    dtypes = Counter(t.dtype for t in m.graph.weights)
    if mode == "f16":
        assert dtypes[DType.F16] > 0 and set(dtypes) <= {DType.F16, DType.F32}
    if mode == "q":
        assert dtypes[DType.Q8_0] > 0 and dtypes[DType.Q4_0] > 0
        assert all(t.dtype is DType.F32 for t in m.graph.weights if t.rank == 1)


# --- what each architecture must get right ----------------------------------------------------------------------
def _attrs(g: Graph, op: str, key: str) -> list[object]:
    return [n.get(key) for n in _nodes(g, op)]


def test_llama_rope_conventions(tiny: dict[str, Path]) -> None:
    hf, gg = load_model(tiny["llama"]).graph, load_model(tiny["llama-f32"]).graph
    assert set(_attrs(hf, "RoPE", "mode")) == {"neox"} and set(_attrs(gg, "RoPE", "mode")) == {"normal"}
    rope = _nodes(hf, "RoPE")[0]
    assert rope.get("scaling_type") == "llama3" and rope.get("factor") == 8.0
    assert rope.get("original_max_position") == 64 and rope.get("theta") == 500000.0
    # GGUF: llama3 scaling is the converter's precomputed rope_freqs tensor
    assert all(n.inputs[2] == "rope_freqs.weight" for n in _nodes(gg, "RoPE"))
    assert set(_attrs(gg, "RoPE", "scaling_type")) == {"none"}


def test_mistral_sliding_window(tiny: dict[str, Path]) -> None:
    for key in ("mistral", "mistral-q"):
        assert set(_attrs(load_model(tiny[key]).graph, "Attention", "sliding_window")) == {16}


def test_qwen2_biases_and_tied_embeddings(tiny: dict[str, Path]) -> None:
    m = load_model(tiny["qwen2"])
    assert m.config.qkv_bias and m.config.tied_embeddings
    producers = m.graph.producers()
    for n in ("q", "k", "v"):
        assert producers[f"blk.0.{n}"].op == "Add"
    assert producers["logits"].inputs[1] == "token_embd.weight"


def test_qwen3_qk_norm(tiny: dict[str, Path]) -> None:
    g = load_model(tiny["qwen3"]).graph
    p = g.producers()
    assert p["blk.0.q.norm"].op == "RMSNorm" and p["blk.0.q.norm"].inputs[1] == "blk.0.attn_q_norm.weight"
    assert g.tensor("blk.0.q.norm").shape == ("seq", 4, 16)


def test_gemma3_norm_offsets_scale_and_layer_pattern(tiny: dict[str, Path]) -> None:
    hf, gg = load_model(tiny["gemma3"]), load_model(tiny["gemma3-f32"])
    assert set(_attrs(hf.graph, "RMSNorm", "add_unit_offset")) == {True}
    assert set(_attrs(gg.graph, "RMSNorm", "add_unit_offset")) == {False}
    # the converter stored 1 + w: the same norm, two namings
    w_hf = hf.weights.read_numpy(hf.graph.tensor("blk.0.attn_norm.weight").weight)  # type: ignore[arg-type]
    w_gg = gg.weights.read_numpy(gg.graph.tensor("blk.0.attn_norm.weight").weight)  # type: ignore[arg-type]
    assert np.allclose(w_gg, w_hf + 1.0)
    for m in (hf, gg):
        g = m.graph
        assert g.tensor("embd.scale").numpy()[0] == pytest.approx(math.sqrt(32))
        assert _attrs(g, "Attention", "sliding_window") == [8, 0]
        assert _attrs(g, "Attention", "scale") == [0.25, 0.25]
        assert _attrs(g, "RoPE", "theta") == [10000.0, 10000.0, 1000000.0, 1000000.0]
        assert set(_attrs(g, "GeGLU", "approximate")) == {"tanh"}
        assert g.producers()["logits"].inputs[1] == "token_embd.weight"
        assert g.meta["config.sliding_layers"] == "true,false"


def test_phi3_fused_projections(tiny: dict[str, Path]) -> None:
    for key in ("phi3", "phi3-q"):
        g = load_model(tiny[key]).graph
        split = _nodes(g, "Split")[0]
        assert split.get("split") == (32, 32, 32) and split.inputs == ("blk.0.attn_qkv",)
        glu = _nodes(g, "SwiGLU")[0]
        assert len(glu.inputs) == 1 and g.tensor(glu.inputs[0]).shape == ("seq", 128)
        assert set(_attrs(g, "RoPE", "rotary_dims")) == {4}


def test_gpt2_conv1d_layout(tiny: dict[str, Path]) -> None:
    hf, gg = load_model(tiny["gpt2"]).graph, load_model(tiny["gpt2-f32"]).graph
    p_hf, p_gg = hf.producers(), gg.producers()
    assert p_hf["blk.0.attn_qkv.mm"].get("transpose_b") is False
    assert hf.tensor("blk.0.attn_qkv.weight").shape == (32, 96)
    assert p_gg["blk.0.attn_qkv.mm"].get("transpose_b") is True
    assert gg.tensor("blk.0.attn_qkv.weight").shape == (96, 32)
    assert p_hf["logits"].get("transpose_b") is True  # the tied head is an Embedding table, [vocab, d]
    for g in (hf, gg):
        assert set(_attrs(g, "Gelu", "approximate")) == {"tanh"}
        assert len(_nodes(g, "LayerNorm")) == 5 and not _nodes(g, "RoPE")
        assert _nodes(g, "Embedding")[1].inputs == ("positions", "position_embd.weight")


def test_bert_encoder(tiny: dict[str, Path]) -> None:
    hf, gg = load_model(tiny["bert"]), load_model(tiny["bert-f32"])
    for m in (hf, gg):
        g = m.graph
        assert g.inputs == ("tokens", "positions", "token_types")
        assert g.outputs == ("hidden_states", "pooled")
        assert set(_attrs(g, "Attention", "causal")) == {False}
        assert all(len(n.inputs) == 3 for n in _nodes(g, "Attention"))  # no KV cache
        assert g.tensor("pooled").shape == (1, 32) and m.config.type_vocab_size == 2
    assert hf.graph.producers()["pooled"].op == "Tanh"
    assert gg.graph.producers()["pooled"].op == "Slice"


def _moe_checks(key: str, tiny: dict[str, Path], normalize: bool, shared: bool) -> LoadedModel:
    m = load_model(tiny[key])
    g = m.graph
    router = _nodes(g, "MoERouter")[0]
    assert router.get("normalize") is normalize and router.get("n_experts") == 4 and router.get("top_k") == 2
    experts = _nodes(g, "MoEExperts")[0]
    assert g.tensor(experts.inputs[3]).shape[0] == 4
    assert bool(_nodes(g, "Sigmoid")) is shared
    return m


@pytest.mark.parametrize("arch, normalize, shared", [("mixtral", True, False), ("qwen2moe", False, True),
                                                     ("qwen3moe", True, False)])
def test_moe_routing(tiny: dict[str, Path], arch: str, normalize: bool, shared: bool) -> None:
    for key in (arch, f"{arch}-f32", f"{arch}-q"):
        _moe_checks(key, tiny, normalize, shared)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe", "qwen3moe"])
def test_per_expert_refs_point_at_the_right_bytes(tiny: dict[str, Path], arch: str) -> None:
    hf, gg = load_model(tiny[arch]), load_model(tiny[f"{arch}-f32"])
    for proj in ("gate", "up", "down"):
        name = f"blk.1.ffn_{proj}_exps.weight"
        bank_ref = gg.graph.tensor(name).weight
        assert bank_ref is not None and bank_ref.expert is None
        bank = gg.weights.read_numpy(bank_ref)  # the whole bank, [experts, rows, cols]
        virtual = hf.graph.tensor(name).weight
        assert virtual is not None and str(virtual) in hf.weights.virtual_banks
        for e in range(4):
            ref = bank_ref.with_expert(e)
            info = gg.weights[ref]
            assert info.nbytes * 4 == gg.weights[bank_ref].nbytes
            assert info.offset == gg.weights[bank_ref].offset + e * info.nbytes
            sliced = gg.weights.read_numpy(ref)
            assert np.array_equal(sliced, bank[e])
            # ...and the same values as the HF checkpoint's own tensor for that expert
            assert np.array_equal(sliced, hf.weights.read_numpy(virtual.with_expert(e)))
            assert str(ref) == f"{tiny[f'{arch}-f32'].name}#{name}#e={e}"


def test_split_gguf_and_sharded_safetensors(tiny: dict[str, Path], tmp_path: Path) -> None:
    shards = H.hf_to_gguf(tiny["qwen2moe"], tmp_path / "split.gguf", "qwen2moe", "q", split_max_tensors=12)
    assert len(shards) > 2
    whole, split = load_model(tiny["qwen2moe-q"]), load_model(shards[0])
    assert [n.op for n in split.graph.nodes] == [n.op for n in whole.graph.nodes]
    files = {str(t.weight).split("#")[0] for t in split.graph.weights}
    assert files == {p.name for p in shards}
    for t in split.graph.weights:
        assert t.weight is not None
        other = whole.graph.tensor(t.name).weight
        assert split.weights.read_bytes(t.weight) == whole.weights.read_bytes(other)  # type: ignore[arg-type]
    hf_dir = H.save_tiny("llama", tmp_path / "sharded", max_shard_size="20KB")
    assert (hf_dir / "model.safetensors.index.json").is_file()
    m = load_model(hf_dir)
    assert len({str(t.weight).split("#")[0] for t in m.graph.weights}) > 2
    assert validate(m.graph) == []
    ref = load_model(tiny["llama"])
    for t in m.graph.weights:
        assert m.weights.read_bytes(t.weight) == ref.weights.read_bytes(  # type: ignore[arg-type]
            ref.graph.tensor(t.name).weight)  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_bf16_checkpoints(tmp_path: Path, arch: str) -> None:
    """bf16 weights: MatMuls take them as they are; biases and embedding rows are cast to f32 activations."""
    m = load_model(H.save_tiny(arch, tmp_path / arch, bf16=True))
    assert validate(m.graph) == []
    dtypes = Counter(t.dtype for t in m.graph.weights)
    assert set(dtypes) == {DType.BF16}
    casts = [n for n in m.graph.nodes if n.op == "Cast"]
    assert casts and all(n.get("to") == "f32" for n in casts)
