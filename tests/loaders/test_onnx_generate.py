"""Generation from ONNX: the KV mapping turns a causal LM's past/present I/O into the IR's KV convention.

Each model is decoded greedily twice: by onnxruntime on the ONNX file (prefill, then one token at a time with the
presents fed back as the past), and by uaii.ir's reference on the *mapped* IR graph (tokens/positions [seq] in,
past_k.N/past_v.N [past, kv_heads, head] in, logits [seq, vocab] and present_k.N/present_v.N out). The tokens must
be the same, token for token, and the mapped graph must be what a backend binds to its KV state
(uaii.ir.kvcache.kv_layers finds every layer). Models: hand-built onnxruntime-genai-style graphs
(GroupQueryAttention), hand-built exporter-style graphs (MatMul/Softmax attention with a causal mask built from
positions; a sliding-window variant; an ALiBi variant that must NOT be mapped), and H4's fixtures with ``greedy``
references when they are available.

The exporter-style graph is also varied in every way the mapping's pattern leaves free (scales on q, keys, scores
and values, biases, how the kv heads are repeated, transposes, masks scaled afterwards, the Softmax axis, the cap of
a soft-cap): each variant either maps and decodes like onnxruntime, or is refused with the reason in ``onnx.kv``
and still runs like onnxruntime unmapped. Sliding windows are found up to the model's context (a window longer than
the default check is not silently dropped: the context is then bounded to what was checked).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.ir import Graph
from uaii.ir.kvcache import kv_layers
from uaii.ir.reference import evaluate
from uaii.loaders import load_model
from uaii.loaders.onnx.dispatch import OnnxImportError
from uaii.loaders.onnx.importer import ImportedGraph, import_graph
from uaii.loaders.onnx.kv import prepare_kv
from uaii.loaders.onnx.kv_verify import DEFAULT_CONTEXT
from uaii.loaders.onnx.reader import open_onnx

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx_lm_support import (  # noqa: E402
    HEAD,
    KV,
    NEW,
    PROMPT,
    VOCAB,
    Builder,
    D,
    causal_fixtures,
    exported_like,
    genai_like,
    ids_input,
    ir_greedy,
    llama_config,
    mapped,
    ort_greedy,
    ort_run,
    save,
    step,
    weights_of,
)


# --- tests ----------------------------------------------------------------------------------------------------
def check_mapped(imported: ImportedGraph, layers: int, kind: str) -> Graph:
    g = imported.graph
    assert g.meta["onnx.kv"] == f"mapped: {kind}"
    assert g.inputs[:2] == ("tokens", "positions") and g.outputs[0] == "logits"
    assert len(kv_layers(g)) == layers
    assert g.tensor("logits").shape[0] == g.tensor("tokens").shape[0]  # [seq, vocab]: batch squeezed
    return g


@pytest.mark.parametrize("window", [-1, 3])
def test_gqa_model_decodes_like_onnxruntime(tmp_path: Path, window: int) -> None:
    path = save(tmp_path, genai_like(window=window))
    want, want_logits = ort_greedy(path, PROMPT, NEW, 2, positions=False)
    _, imported = mapped(path)
    g = check_mapped(imported, 2, "gqa")
    assert g.meta["context_length"] == "256"  # the rows of the rotary caches
    got, got_logits = ir_greedy(imported, PROMPT, NEW)
    assert got == want
    np.testing.assert_allclose(got_logits[0], want_logits[0], atol=1e-4, rtol=1e-4)
    if window > 0:
        assert {n.get("sliding_window") for n in g.nodes if n.op == "Attention"} == {window}


def test_int4_gqa_model_decodes_like_onnxruntime(tmp_path: Path) -> None:
    """The builder's int4 layout: MatMulNBits projections (packed weights) around GroupQueryAttention."""
    path = save(tmp_path, genai_like(quantized=True))
    want, want_logits = ort_greedy(path, PROMPT, NEW, 2, positions=False)
    _, imported = mapped(path)
    g = check_mapped(imported, 2, "gqa")
    assert sum(n.op == "MatMulNBits" for n in g.nodes) == 11
    got, got_logits = ir_greedy(imported, PROMPT, NEW)
    assert got == want
    np.testing.assert_allclose(got_logits[0], want_logits[0], atol=1e-4, rtol=1e-4)


def test_gqa_model_chunked_prefill(tmp_path: Path) -> None:
    path = save(tmp_path, genai_like())
    want, _ = ort_greedy(path, PROMPT, 4, 2, positions=False)
    _, imported = mapped(path)
    got, _ = ir_greedy(imported, PROMPT, 4, chunks=(2, 2))
    assert got == want


@pytest.mark.parametrize("window", [0, 3])
def test_exported_attention_decodes_like_onnxruntime(tmp_path: Path, window: int) -> None:
    path = save(tmp_path, exported_like(window=window))
    want, want_logits = ort_greedy(path, PROMPT, NEW, 2, positions=True)
    _, imported = mapped(path)
    g = check_mapped(imported, 2, "attention")
    attn = [n for n in g.nodes if n.op == "Attention"]
    assert [n.get("sliding_window") for n in attn] == [window, window]
    assert all(n.get("causal") for n in attn)
    assert set(g.outputs) == {"logits", *(f"present_{c}.{i}" for i in range(2) for c in "kv")}  # probes gone
    got, got_logits = ir_greedy(imported, PROMPT, NEW)
    assert got == want
    np.testing.assert_allclose(got_logits[0], want_logits[0], atol=1e-4, rtol=1e-4)


def test_exported_softcap_and_unmasked_attention(tmp_path: Path) -> None:
    for name, model, causal in (("softcap", exported_like(softcap=2.0), True),
                                ("unmasked", exported_like(masked=False), False)):
        path = save(tmp_path / name, model)
        want, _ = ort_greedy(path, PROMPT, 4, 2, positions=True)
        _, imported = mapped(path)
        attn = [n for n in check_mapped(imported, 2, "attention").nodes if n.op == "Attention"]
        assert [n.get("causal") for n in attn] == [causal, causal]
        assert [n.get("softcap") for n in attn] == [2.0 if name == "softcap" else 0.0] * 2
        assert ir_greedy(imported, PROMPT, 4)[0] == want


def unmapped_like_onnxruntime(path: Path, *why: str) -> str:
    """The model is imported without the mapping, ``onnx.kv`` says why (``why`` in it), and the full forward of
    the prompt still gives onnxruntime's logits. Returns the reason."""
    _, imported = mapped(path)
    g = imported.graph
    reason = g.meta["onnx.kv"]
    assert reason.startswith("none: ") and all(w in reason for w in why), reason
    assert "input_ids" in g.inputs and not kv_layers(g)
    feeds = {"input_ids": np.asarray([PROMPT], np.int64), "attention_mask": np.ones((1, 5), np.int64),
             "position_ids": np.arange(5, dtype=np.int64)[None],
             **{f"past_key_values.{i}.{t}": np.zeros((1, KV, 0, HEAD), np.float32) for i in range(2)
                for t in ("key", "value")}}
    want = ort_run(path, feeds)["logits"]
    got = evaluate(g, feeds, weights_of(imported))["logits"]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    return reason


def test_alibi_bias_is_not_mapped_and_still_runs(tmp_path: Path) -> None:
    unmapped_like_onnxruntime(save(tmp_path, exported_like(alibi=True)), "ALiBi")


# --- every degree of freedom of the exporter's pattern: carried exactly, or refused --------------------------------
CARRIED: dict[str, tuple[dict[str, Any], float]] = {  # variant -> (exported_like arguments, the Attention's scale)
    "q-bias": ({"q_bias": True}, HEAD ** -0.5),
    "scale-on-q-and-keys": ({"scale_split": True}, HEAD ** -0.5),
    "masked-then-scaled": ({"post_scale": 0.5}, 0.5 * HEAD ** -0.5),
    "unit-value-scale": ({"v_scale": 1.0, "scale": 0.3}, 0.3),
}


@pytest.mark.parametrize("name", sorted(CARRIED))
def test_pattern_variants_the_mapping_carries_exactly(tmp_path: Path, name: str) -> None:
    kwargs, scale = CARRIED[name]
    path = save(tmp_path, exported_like(**kwargs))
    want, want_logits = ort_greedy(path, PROMPT, 4, 2, positions=True)
    _, imported = mapped(path)
    attn = [n for n in check_mapped(imported, 2, "attention").nodes if n.op == "Attention"]
    assert all(np.isclose(n.get("scale"), scale, rtol=1e-6) for n in attn), [n.get("scale") for n in attn]
    got, got_logits = ir_greedy(imported, PROMPT, 4)
    assert got == want
    np.testing.assert_allclose(got_logits[0], want_logits[0], atol=1e-4, rtol=1e-4)


REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {  # variant -> (arguments, words of the reason)
    "value-scale": ({"v_scale": 2.0}, ("values", "scaled by 2", "no scale for the values")),
    "tiled-head-repeat": ({"repeat": "tiled"}, ("head repeat of the keys", "[2, 2, 1, ", "in place")),
    "key-bias": ({"k_bias": True}, ("not a concatenated cache", "Add")),
    "value-bias": ({"v_bias": True}, ("not a concatenated cache", "Add")),
    "per-head-score-scale": ({"head_scales": True}, ("Mul", "not a nonzero scalar constant")),
    "key-transposes": ({"key_transposes": True}, ("not a concatenated cache", "Transpose")),
    "mask-scaled-away": ({"post_scale": 1e-3, "mask_value": -1e4}, ("scaled by 0.001 afterwards", "not a mask")),
    "mask-negated": ({"post_scale": -1.0}, ("multiplied by -1 afterwards",)),
    "zero-scale": ({"scale": 0.0}, ("scaled by 0", "1/sqrt(head_dim)")),
    "softcap-two-caps": ({"softcap": 2.0, "softcap_inner": 3.0}, ("Tanh", "between the attention scores")),
    "softmax-over-queries": ({"softmax_axis": 2}, ("normalizes axis 2",)),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_pattern_variants_the_mapping_refuses(tmp_path: Path, name: str) -> None:
    """Each of these maps to an IR Attention that computes something else than the graph (the value scale, the
    tiled repeat and the scaled-away mask did, before the mapping checked them): refused, and run unmapped."""
    kwargs, why = REFUSED[name]
    unmapped_like_onnxruntime(save(tmp_path, exported_like(**kwargs)), *why)


def test_softmax_default_axis_before_opset_13_is_not_the_keys_axis(tmp_path: Path) -> None:
    """Softmax-1/11 without ``axis`` normalizes axis 1 onwards (all heads, queries and keys at once)."""
    model = exported_like()
    for node in model.graph.node:
        if node.op_type == "Softmax":
            del node.attribute[:]
    plan = prepare_kv(open_onnx(save(tmp_path / "13", model)))
    assert plan.mapped  # opset 18: the default axis is -1
    next(o for o in model.opset_import if o.domain == "").version = 12
    plan = prepare_kv(open_onnx(save(tmp_path / "12", model)))
    assert not plan.mapped and "normalizes axis 1 (the default before opset 13)" in plan.reason, plan.reason


# --- sliding windows up to the context ------------------------------------------------------------------------
def long_past_logits(path: Path, imported: ImportedGraph, past: int) -> tuple[np.ndarray, np.ndarray]:
    """One token after ``past`` cached ones, by onnxruntime and by the mapped graph: keys all zero (every key
    scores alike) and the first cached value large, so whether a query still sees position 0 shows in the logits."""
    rng = np.random.default_rng(5)
    caches = {}
    for i in range(2):
        v = np.zeros((past, KV, HEAD), np.float32)
        v[0] = rng.standard_normal((KV, HEAD)) * 1e4
        caches[i] = (np.zeros((past, KV, HEAD), np.float32), v)
    feeds = {"input_ids": np.asarray([[7]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64),
             "position_ids": np.asarray([[past]], np.int64),
             **{f"past_key_values.{i}.{t}": np.ascontiguousarray(c.transpose(1, 0, 2)[None])
                for i, (k, v) in caches.items() for t, c in (("key", k), ("value", v))}}
    want = ort_run(path, feeds)["logits"][0, -1]
    state = {f"past_{t}.{i}": c for i, (k, v) in caches.items() for t, c in (("k", k), ("v", v))}
    got = step(imported.graph, weights_of(imported), [7], past, state, kv_layers(imported.graph))["logits"][-1]
    return got, want


def test_a_window_longer_than_the_default_check_is_found_at_the_models_context(tmp_path: Path) -> None:
    """config.json says 32768 positions: the masks are checked there, and a 10000-key window shows (and is then
    onnxruntime's at 10001 tokens, where it hides the first key)."""
    window = DEFAULT_CONTEXT + 1808
    path = save(tmp_path, exported_like(window=window))
    (tmp_path / "config.json").write_text(json.dumps(llama_config(32768)))
    _, imported = mapped(path)
    g = check_mapped(imported, 2, "attention")
    assert [n.get("sliding_window") for n in g.nodes if n.op == "Attention"] == [window, window]
    assert "context_length" not in g.meta  # config.json tells it
    assert load_model(path).config.context_length == 32768
    got, want = long_past_logits(path, imported, window)
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-4)


def test_without_a_context_the_checked_length_bounds_the_sequence(tmp_path: Path) -> None:
    """No config.json: the masks are checked at DEFAULT_CONTEXT tokens, where a longer window does not show, so
    the layer maps without one — and the model's context becomes what was checked, so no sequence reaches the
    window (past it the unwindowed layer would differ from onnxruntime, as the last lines show)."""
    window = DEFAULT_CONTEXT + 1808
    path = save(tmp_path, exported_like(window=window))
    _, imported = mapped(path)
    g = check_mapped(imported, 2, "attention")
    assert [n.get("sliding_window") for n in g.nodes if n.op == "Attention"] == [0, 0]
    assert g.meta["context_length"] == str(DEFAULT_CONTEXT)
    assert load_model(path).config.context_length == DEFAULT_CONTEXT
    got, want = long_past_logits(path, imported, window)
    assert not np.allclose(got, want, atol=1e-3, rtol=1e-4)


def test_a_mask_too_costly_to_check_at_the_context_is_refused(tmp_path: Path) -> None:
    """A mask computed for every position pair ([total, total], then the new rows sliced) grows as tokens^2: at a
    65536-token context that is tens of GiB, so the mapping refuses instead of trying."""
    path = save(tmp_path, exported_like(square_mask=True))
    (tmp_path / "config.json").write_text(json.dumps(llama_config(65536)))
    unmapped_like_onnxruntime(path, "context of 65536 tokens", "GiB", "tokens^2.0")


# --- GroupQueryAttention's lengths ------------------------------------------------------------------------------
def test_gqa_lengths_that_are_not_an_unpadded_sequence_are_refused(tmp_path: Path) -> None:
    """seqlens_k = sum(mask) instead of sum(mask) - 1: onnxruntime then reads one more past token than there is.
    The cached layer cannot do that, so the mapping refuses; unmapped, this model's functional GroupQueryAttention
    cannot be imported either (its cache declares a symbolic head size), so the import fails, saying why the
    mapping was not applied."""
    path = save(tmp_path, genai_like(layers=1, seqlens_offset=0))
    plan = prepare_kv(open_onnx(path))
    assert plan.mapped
    with pytest.raises(OnnxImportError) as info:
        plan.finish(import_graph(plan.file, internal=True))
    msg = str(info.value)
    assert "KV-cache mapping was not applied" in msg, msg
    assert "GroupQueryAttention's seqlens_k is [4] at 4 new and 0 cached tokens, not [3]" in msg, msg


def test_a_model_without_kv_io_says_why(tmp_path: Path) -> None:
    b = Builder(3)
    b.nodes.append(helper.make_node("MatMul", [b.op("Gather", [b.w(VOCAB, D), "input_ids"]), b.w(D, VOCAB)],
                                    ["logits"]))
    path = save(tmp_path, b.model([ids_input("input_ids", "sequence_length")], ["logits"]))
    plan, imported = mapped(path)
    assert not plan.mapped and plan.file is plan.source
    assert imported.graph.meta["onnx.kv"].startswith("none: the model has no past_key_values")


def test_a_cache_of_another_layout_is_not_mapped(tmp_path: Path) -> None:
    model = genai_like(layers=1)
    for vi in model.graph.input:
        if vi.name.startswith("past_key_values"):
            del vi.type.tensor_type.shape.dim[0]  # [kv_heads, past, head]: no batch axis
    plan = prepare_kv(open_onnx(save(tmp_path, model)))
    assert not plan.mapped and "must be [batch, kv_heads, past, head]" in plan.reason


def test_unknown_extra_input_is_not_mapped(tmp_path: Path) -> None:
    model = genai_like(layers=1)
    model.graph.input.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["b", "s"]))
    plan = prepare_kv(open_onnx(save(tmp_path, model)))
    assert not plan.mapped and "token_type_ids" in plan.reason


def test_a_graph_whose_nodes_form_a_cycle_is_refused(tmp_path: Path) -> None:
    """Not an endless walk: the mapping's reordering of the rewritten nodes refuses a cycle (the importer then says
    that ONNX needs the nodes in topological order)."""
    model = genai_like(layers=1)
    head = next(n for n in model.graph.node if "logits" in n.output)
    head.output[:] = ["logits.pre"]
    model.graph.node.extend([helper.make_node("Add", ["logits.pre", "logits.loop"], ["logits"]),
                             helper.make_node("Identity", ["logits"], ["logits.loop"])])
    plan = prepare_kv(open_onnx(save(tmp_path, model)))
    assert not plan.mapped and "cycle" in plan.reason


# --- H4's fixtures --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_fixture_greedy_matches_onnxruntime() -> None:
    """Every causal-kv fixture maps and decodes as onnxruntime did. uaii.ir's reference computes int4 layers exactly;
    onnxruntime's accuracy_level 4 quantizes activations to 8 bits. So the tokens must agree until onnxruntime's own
    margin (top-1 minus top-2 logit) at a step is below the fixture's documented tolerance: a near-tie there may go
    either way, and the continuations differ after it."""
    for path, entry in causal_fixtures():
        _, imported = mapped(path)
        assert imported.graph.meta["onnx.kv"].startswith("mapped: "), (entry["name"], imported.graph.meta["onnx.kv"])
        greedy = entry["greedy"]
        want, margins = list(greedy["tokens"]), greedy.get("margins") or [np.inf] * len(greedy["tokens"])
        got, _ = ir_greedy(imported, list(greedy["prompt_ids"]), len(want))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g != w:
                assert margins[i] < float(entry["tolerance"]), (entry["name"], i, got, want)
                break
