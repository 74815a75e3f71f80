"""The synthetic-model generators of bench/synth_gguf.py, at tiny sizes: the files load through uaii.loaders into
validated graphs of the requested shapes (experts split per reference), a Session generates from them with finite
logits, the streaming writer keeps a small memory footprint, and the cache sidecar catches a corrupted file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
D, HEADS, KV_HEADS, D_FF, VOCAB, LAYERS = 64, 4, 2, 128, 768, 2
N_EXPERTS, TOP_K, D_FF_EXPERT = 8, 2, 32


synth = load_script("bench/synth_gguf.py", "synth_gguf")


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "llama.gguf"
    return synth.write_llama_gguf(path, LAYERS, D, HEADS, KV_HEADS, D_FF, VOCAB, seed=3)


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "moe.gguf"
    return synth.write_moe_gguf(path, LAYERS, D, D_FF_EXPERT, n_experts=N_EXPERTS, top_k=TOP_K, vocab=VOCAB,
                                n_heads=HEADS, n_kv_heads=KV_HEADS, seed=3)


def _shapes(graph) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(int(d) for d in t.shape) for t in graph.weights}


def test_llama_loads_into_a_validated_graph(llama_path: Path) -> None:
    from uaii.ir import DType
    from uaii.loaders import load_model
    from uaii.loaders.model import check_graph

    model = load_model(llama_path)
    check_graph(model.graph)
    cfg = model.config
    assert (cfg.architecture, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size) == \
        ("llama", LAYERS, D, HEADS, KV_HEADS, D_FF, VOCAB)
    shapes = _shapes(model.graph)
    hd = D // HEADS
    assert shapes["token_embd.weight"] == (VOCAB, D)
    assert shapes["blk.1.attn_q.weight"] == (HEADS * hd, D)
    assert shapes["blk.1.attn_k.weight"] == (KV_HEADS * hd, D)
    assert shapes["blk.0.ffn_down.weight"] == (D, D_FF)
    assert shapes["output.weight"] == (VOCAB, D)
    dtypes = {t.name: t.dtype for t in model.graph.weights}
    assert dtypes["blk.0.ffn_gate.weight"] is DType.Q4_0 and dtypes["blk.0.attn_norm.weight"] is DType.F32


def test_moe_loads_with_per_expert_references(moe_path: Path) -> None:
    from uaii.loaders import load_model
    from uaii.loaders.model import check_graph

    model = load_model(moe_path)
    check_graph(model.graph)
    cfg = model.config
    assert (cfg.architecture, cfg.n_experts, cfg.n_experts_used, cfg.d_ff_expert) == \
        ("mixtral", N_EXPERTS, TOP_K, D_FF_EXPERT)
    shapes = _shapes(model.graph)
    assert shapes["blk.0.ffn_gate_inp.weight"] == (N_EXPERTS, D)
    assert shapes["blk.1.ffn_up_exps.weight"] == (N_EXPERTS, D_FF_EXPERT, D)
    assert shapes["blk.1.ffn_down_exps.weight"] == (N_EXPERTS, D, D_FF_EXPERT)
    moe = [n for n in model.graph.nodes if n.op.value == "MoEExperts"]
    assert len(moe) == LAYERS
    assert all((n.get("n_experts"), n.get("top_k")) == (N_EXPERTS, TOP_K) for n in moe)
    refs = set(model.weights)
    bank = model.weights[f"{moe_path.name}#blk.0.ffn_gate_exps.weight"]
    for layer in range(LAYERS):
        for proj in ("gate", "up", "down"):
            for e in range(N_EXPERTS):
                assert f"{moe_path.name}#blk.{layer}.ffn_{proj}_exps.weight#e={e}" in refs
    one = model.weights[f"{moe_path.name}#blk.0.ffn_gate_exps.weight#e=3"]
    assert one.nbytes * N_EXPERTS == bank.nbytes


@pytest.mark.parametrize("which", ["llama", "moe"])
def test_session_generates_with_finite_logits(which: str, llama_path: Path, moe_path: Path) -> None:
    from uaii.runtime import Session

    with Session(llama_path if which == "llama" else moe_path) as s:
        ids = s.tokenize("Hello world, the history of computing")
        assert ids and max(ids) < VOCAB
        logits = s.forward(ids)
        assert logits.shape == (VOCAB,) and np.isfinite(logits).all() and logits.std() > 0
        s.reset()
        res = s.generate(ids, max_new_tokens=4, ignore_eos=True)
        assert len(res.tokens) == 4 and all(0 <= t < VOCAB for t in res.tokens)
        assert isinstance(res.text, str)


def test_quantized_blocks_have_the_chosen_finite_scale(llama_path: Path) -> None:
    reader = gguf.GGUFReader(llama_path)
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert t.data_offset % reader.alignment == 0
    raw = np.asarray(t.data, dtype=np.uint8).reshape(-1, 18)
    scales = raw[:, :2].copy().view(np.float16).ravel()
    assert np.isfinite(scales).all() and np.unique(np.abs(scales)).size == 1
    assert abs(scales[0]) == np.float16(0.5 / np.sqrt(21.5 * D))
    values = gguf.quants.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType.Q4_0)
    assert np.isfinite(values).all() and 0 < np.abs(values).max() < 1
    # the sign is random per block: Q4_0's random nibbles decode to -8..7 (mean -0.5), and one sign would add the
    # same component to every token's hidden state (a MoE router then picked the same experts for every token)
    assert 0.3 < np.mean(scales < 0) < 0.7
    assert abs(values.mean()) < 0.05 * values.std()


def test_moe_head_dim_and_router_locality(tmp_path: Path, moe_path: Path) -> None:
    """Qwen3-MoE-like heads (head_dim apart from d_model / heads) and routers whose rows carry a per-layer
    popularity: only the router tensors differ from the file without locality, and a session routes through
    them."""
    from uaii.runtime import Session

    kw = dict(n_experts=N_EXPERTS, top_k=TOP_K, vocab=VOCAB, n_heads=HEADS, n_kv_heads=KV_HEADS, seed=3)
    flat = synth.write_moe_gguf(tmp_path / "flat.gguf", LAYERS, D, D_FF_EXPERT, head_dim=48, **kw)
    local = synth.write_moe_gguf(tmp_path / "local.gguf", LAYERS, D, D_FF_EXPERT, head_dim=48, router_zipf=1.5,
                                 **kw)
    a, b = gguf.GGUFReader(flat), gguf.GGUFReader(local)
    assert int(a.fields["llama.attention.key_length"].parts[-1][0]) == 48
    assert tuple(int(x) for x in next(t for t in a.tensors if t.name == "blk.0.attn_q.weight").shape) == (D, HEADS * 48)
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        same = np.array_equal(np.asarray(ta.data), np.asarray(tb.data))
        assert same == ("ffn_gate_inp" not in ta.name), ta.name
        if "ffn_gate_inp" in ta.name:
            norms = np.linalg.norm(np.asarray(tb.data, np.float32), axis=1)
            assert norms.max() / norms.min() > 2.0 ** 1.5      # rank 1 against rank >= 2: (r + 1) ** -1.5
            assert np.isclose(np.mean(norms ** 2), np.mean(np.linalg.norm(np.asarray(ta.data), axis=1) ** 2),
                              rtol=0.3)
    with Session(local) as s:
        res = s.generate(s.tokenize("Hello world"), max_new_tokens=3, ignore_eos=True)
        assert len(res.tokens) == 3
    with pytest.raises(ValueError, match="router_zipf"):
        synth.write_moe_gguf(tmp_path / "bad.gguf", LAYERS, D, D_FF_EXPERT, router_zipf=-1.0, **kw)


def test_same_seed_same_bytes(tmp_path: Path, llama_path: Path) -> None:
    again = synth.write_llama_gguf(tmp_path / "again.gguf", LAYERS, D, HEADS, KV_HEADS, D_FF, VOCAB, seed=3)
    assert synth.sha256_of(again) == synth.sha256_of(llama_path)
    other = synth.write_llama_gguf(tmp_path / "other.gguf", LAYERS, D, HEADS, KV_HEADS, D_FF, VOCAB, seed=4)
    assert synth.sha256_of(other) != synth.sha256_of(llama_path)


def test_cache_reuses_and_regenerates_a_corrupted_file(tmp_path: Path) -> None:
    params = synth.model_params("moe", 1, d_model=64, d_ff_expert=32, n_experts=4, top_k=2, vocab=VOCAB,
                                n_heads=4, n_kv_heads=2)
    path = tmp_path / "m.gguf"
    first = synth.ensure_synth(path, params)
    assert not first["reused"] and synth.sha256_of(path) == first["sha256"]
    assert synth.ensure_synth(path, params)["reused"]
    with open(path, "r+b") as f:  # overwrite a stretch of the data in place: same size, same sidecar
        f.seek(path.stat().st_size // 2)
        f.write(b"\0" * 4096)
    assert synth.cached_ok(path, params) == (False, "probe sha256 mismatch")
    again = synth.ensure_synth(path, params)
    assert not again["reused"] and again["sha256"] == first["sha256"]
    assert synth.ensure_synth(path, {**params, "seed": 1})["reused"] is False  # other parameters: rewritten
    assert not list(tmp_path.glob(".*tmp*"))


def test_cli_streams_with_a_small_footprint(tmp_path: Path) -> None:
    """~200 MB written with the generator's peak RSS far below the file size (chunked, never whole tensors)."""
    out = tmp_path / "big.gguf"
    cmd = [sys.executable, str(REPO / "bench" / "synth_gguf.py"), "llama", "--out", str(out), "--size-gb", "0.2",
           "--d-model", "1024", "--n-heads", "8", "--n-kv-heads", "2", "--d-ff", "4096", "--json"]
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    assert res["size"] == out.stat().st_size >= 0.2e9
    assert res["peak_rss_bytes"] < 200 << 20
    assert json.loads(out.with_name(out.name + ".json").read_text())["sha256"] == res["sha256"]
