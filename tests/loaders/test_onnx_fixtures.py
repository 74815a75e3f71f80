"""The ONNX fixture generator (scripts/onnx_fixtures.py) itself: the manifest is complete, every model passes
onnx.checker, every reference is what onnxruntime computes, the MatMulNBits quantizer follows the contrib spec, and
a second run generates nothing.

The tests over the whole set are slow: the first one of a process generates it (minutes, once per cache key).
The others generate a few hand-built graphs into a temporary directory.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx_fixture_support import (
    OnnxFixture,
    assert_outputs_close,
    fixture,
    fixtures,
    generator,
    manifest,
    onnx_fixtures_dir,
)
from repo_scripts import load_script

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("onnx", "onnxruntime")),
    reason="the ONNX fixtures need onnx and onnxruntime (the test-loaders environment has them)")

KINDS = {"forward", "causal", "causal-kv"}
EXPORTERS = {"torch-dynamo": 18, "torch-legacy": 14, "torch-legacy-optimum": 14, "onnxruntime-genai-builder": None,
             "onnx-helper": None}
SMALL = ["ops-cast", "ops-matmulnbits-b4-bs32-zp-bias", "ops-matmulnbits-b8-bs32-acc4"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*")}


# --- the generator on a few graphs ---------------------------------------------------------------------------------
def test_second_run_generates_nothing(tmp_path: Path) -> None:
    gen = generator()
    out = tmp_path / "set"
    assert gen.generate(out, only=SMALL, jobs=1) == out
    entries = json.loads((out / "manifest.json").read_text())["fixtures"]
    assert [e["name"] for e in entries] == [n for n in gen.fixture_names() if n in SMALL]
    before = _tree(out)
    assert gen.generate(out, only=SMALL, jobs=1) == out
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["set"]  # no temporary directory left behind


def test_failed_generation_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = generator()
    registry = gen._registry

    def broken(dest: Path) -> dict[str, Any]:
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(gen, "_registry", lambda: {**registry(), "ops-broken": ("graphs", 0.1, broken)})
    with pytest.raises(RuntimeError, match="exporter exploded"):
        gen.generate(tmp_path / "set", only=["ops-cast", "ops-broken"], jobs=1)
    assert list(tmp_path.iterdir()) == []


def test_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("not a fixture set")
    with pytest.raises(ValueError, match=r"without a manifest\.json"):
        generator().generate(tmp_path, only=["ops-cast"], jobs=1)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_selection_and_cache_key(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = generator()
    names = gen.fixture_names()
    assert gen.select(["ops-matmulnbits-b8-*"]) == [n for n in names if n.startswith("ops-matmulnbits-b8-")]
    with pytest.raises(ValueError, match="no fixture matches"):
        gen.select(["llama-nonexistent"])
    full, subset = gen.cache_key(), gen.cache_key(["ops-cast"])
    assert full != subset and gen.cache_key(names) == full
    monkeypatch.setattr(gen, "versions", lambda: {"onnxruntime": "0.0.0"})
    assert gen.cache_key() != full  # another onnxruntime: another set


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Values of a packed uint8 row, low nibble first (the contrib spec), written independently of the generator."""
    if bits == 8:
        return packed[..., :count].astype(np.int64)
    lo, hi = packed & 0x0F, packed >> 4
    return np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], -1)[..., :count].astype(np.int64)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zero_points", [None, "uint8", "float"])
def test_matmulnbits_quantizer_follows_the_spec(bits: int, block: int, zero_points: str | None) -> None:
    graphs = load_script("scripts/onnx_fixtures_graphs.py", "uaii_scripts_onnx_fixtures_graphs")
    rng = np.random.default_rng(bits * 1000 + block)
    n, k = 5, 2 * block + 3  # a padded last block
    w = rng.standard_normal((n, k)).astype(np.float32)
    q = graphs.quantize_nbits(w, bits, block, zero_points)
    blocks = -(-k // block)
    assert q["B"].shape == (n, blocks, block * bits // 8) and q["B"].dtype == np.uint8
    assert q["scales"].shape == (n * blocks,) and q["scales"].dtype == np.float32
    values = _unpack(q["B"], bits, block)  # [n, blocks, block]
    scales = q["scales"].reshape(n, blocks).astype(np.float64)
    if zero_points is None:
        zp = np.full((n, blocks), 1 << (bits - 1), np.float64)
        assert "zero_points" not in q
    elif zero_points == "uint8":
        per_row = -(-blocks * bits // 8)
        assert q["zero_points"].shape == (n * per_row,) and q["zero_points"].dtype == np.uint8
        zp = _unpack(q["zero_points"].reshape(n, per_row), bits, blocks).astype(np.float64)
    else:
        assert q["zero_points"].shape == (n * blocks,) and q["zero_points"].dtype == np.float32
        zp = q["zero_points"].reshape(n, blocks).astype(np.float64)
    dequant = ((values - zp[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
    np.testing.assert_array_equal(dequant, q["dequant"])
    # a faithful quantizer: every weight within half a step, one where rounding the zero point and the value both
    # up clips at the top code, 1.5 with the float zero points' deliberate quarter-step shift
    step = np.repeat(scales, block, axis=1)[:, :k]
    bound = {None: 0.5, "uint8": 1.0, "float": 1.5}[zero_points]
    assert np.all(np.abs(dequant - w) <= bound * step + 1e-6)


def test_matmulnbits_graphs_compute_the_spec(tmp_path: Path) -> None:
    """onnxruntime's references of the MatMulNBits graphs are float64 dequantize-then-matmul of the weights in the
    files, dequantized here from the contrib spec (not with the generator's code)."""
    import onnx
    from onnx import numpy_helper

    names = ["ops-matmulnbits-b4-bs16-zp-bias", "ops-matmulnbits-b8-bs256", "ops-matmulnbits-b4-bs128-zpf-bias"]
    out = generator().generate(tmp_path / "set", only=names, jobs=1)
    for entry in json.loads((out / "manifest.json").read_text())["fixtures"]:
        model = onnx.load(str(out / entry["file"]))
        (node,) = model.graph.node
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        bits, block, k, n = attrs["bits"], attrs["block_size"], attrs["K"], attrs["N"]
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        blocks = -(-k // block)
        values = _unpack(inits["B"], bits, block)
        scales = inits["scales"].reshape(n, blocks).astype(np.float64)
        zp: np.ndarray = np.full((n, blocks), float(1 << (bits - 1)))
        if "zero_points" in inits:
            z = inits["zero_points"]
            zp = (z.reshape(n, blocks).astype(np.float64) if z.dtype != np.uint8
                  else _unpack(z.reshape(n, -1), bits, blocks).astype(np.float64))
        w = ((values - zp[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
        with np.load(out / entry["inputs"]) as a, np.load(out / entry["outputs"]) as y:
            want = a["A"].astype(np.float64) @ w.T + inits.get("bias", np.zeros(n))
            np.testing.assert_allclose(y["Y"], want, rtol=1e-4, atol=1e-4, err_msg=entry["name"])


# --- the whole set -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_manifest_is_complete() -> None:
    gen = generator()
    entries = manifest()
    assert [e["name"] for e in entries] == gen.fixture_names()
    root = onnx_fixtures_dir()
    for e in entries:
        fx = fixture(e["name"])
        assert fx.model.is_file() and fx.model.suffix == ".onnx", e["name"]
        assert e["kind"] in KINDS and e["exporter"] in EXPORTERS, e["name"]
        expected_opset = EXPORTERS[e["exporter"]]
        assert expected_opset is None or e["opset"] == expected_opset, e["name"]
        assert e["opsets"][""] == e["opset"] and sum(sum(c.values()) for c in e["ops"].values()) > 0
        assert (root / e["inputs"]).is_file() and (root / e["outputs"]).is_file()
        assert set(fx.inputs()) and set(fx.outputs()), e["name"]
        if e["exporter"] != "onnx-helper":  # a model's inputs: batch 1
            assert all(v.shape[0] == 1 for v in fx.inputs().values()), e["name"]
        assert 0 < e["tolerance"] <= (1e-4 if "reference_f32" not in e else 1.0)
        assert (fx.directory / "tokenizer.json").is_file() == e["tokenizer"], e["name"]
        if e["kind"] == "forward":
            assert "greedy" not in e and "kv" not in e
        else:
            greedy = e["greedy"]
            assert len(greedy["tokens"]) == len(greedy["margins"]) == gen.GREEDY_STEPS
            assert greedy["prompt_ids"] == [int(t) for t in fx.inputs()["input_ids"][0]]
            assert ("kv" in e) == (e["kind"] == "causal-kv")
    names = {e["name"] for e in entries}
    for arch in ("llama", "qwen2", "gemma3", "gpt2", "bert", "mixtral"):
        assert {f"{arch}-dynamo", f"{arch}-legacy"} <= names
        assert fixture(f"{arch}-dynamo").kind == ("forward" if arch == "bert" else "causal")
    assert {"llama-kv-optimum", "qwen2-kv-optimum", "genai-llama-int4", "genai-qwen2-int4",
            "external-unaligned"} <= names


@pytest.mark.slow
def test_every_model_passes_the_checker() -> None:
    gen = generator()
    for e in manifest():
        note = gen.check_model(fixture(e["name"]).model)
        assert note == e.get("checker_note"), e["name"]
        if note:  # only the genai builder's SimplifiedLayerNormalization in the ai.onnx domain needs the help
            assert e["exporter"] == "onnxruntime-genai-builder" and "SimplifiedLayerNormalization" in e["ops"][""]


def _reproduce(fx: OnnxFixture) -> None:
    gen = generator()
    session = gen.ort_session(fx.model)
    got = gen.ort_run(session, fx.inputs())
    # the same onnxruntime on the same inputs; another CPU may take other kernels (ISA), hence not bit-exact
    assert_outputs_close(fx, got, tolerance=fx.tolerance / 10)
    if fx.greedy is None:
        return
    prompt = fx.greedy["prompt_ids"]
    tokens, _ = gen.greedy_kv(session, prompt, fx.kv) if fx.kv else gen.greedy_full(session, prompt)
    for step, (a, b, margin) in enumerate(zip(tokens, fx.greedy["tokens"], fx.greedy["margins"], strict=True)):
        if a != b:
            assert margin < 1e-3, f"{fx.name}: greedy token {step} is {a}, the manifest says {b} (margin {margin})"
            break


@pytest.mark.slow
def test_references_are_onnxruntimes() -> None:
    for fx in fixtures():
        _reproduce(fx)


@pytest.mark.slow
def test_external_data_is_unaligned() -> None:
    import onnx

    fx = fixture("external-unaligned")
    model = onnx.load(str(fx.model), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) >= 10
    size = (fx.directory / "data" / "weights.bin").stat().st_size
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        assert info["location"] == "data/weights.bin"
        offset, length = int(info["offset"]), int(info["length"])
        assert offset % 2 == 1 and offset + length <= size, t.name
    np.testing.assert_array_equal(fx.outputs()["logits"], fixture("llama-legacy").outputs()["logits"])


@pytest.mark.slow
def test_exporters_agree_on_the_same_weights() -> None:
    """Both exporters of an architecture and the KV export share the weights: the same greedy continuation and
    the same logits (each is already checked against torch by the generator)."""
    for arch in ("llama", "qwen2", "gemma3", "gpt2", "mixtral"):
        dyn, leg = fixture(f"{arch}-dynamo"), fixture(f"{arch}-legacy")
        assert dyn.greedy is not None and leg.greedy is not None
        assert dyn.greedy["tokens"] == leg.greedy["tokens"], arch
        np.testing.assert_allclose(dyn.outputs()["logits"], leg.outputs()["logits"], rtol=1e-4, atol=1e-4)
    for arch in ("llama", "qwen2"):
        kv = fixture(f"{arch}-kv-optimum")
        np.testing.assert_allclose(kv.outputs()["logits"], fixture(f"{arch}-legacy").outputs()["logits"],
                                   rtol=1e-4, atol=1e-4)
