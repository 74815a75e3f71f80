"""evaluate(): a llama-style block (prefill then decode with the KV cache fed back), feeds and weights checks,
scheduling, pruning and error messages."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from graph_builder import GraphBuilder

from uaii.ir import DType, Graph, Tensor, check
from uaii.ir.reference import EvaluationError, evaluate

D, H, KV, HD, FF, VOCAB, EPS = 32, 4, 2, 8, 64, 50, 1e-5
Builder = GraphBuilder


def llama_block(weight_dtype: str = "f32") -> Graph:
    """Embedding → RMSNorm → q/k/v → RoPE → Attention (GQA, KV cache) → o + residual → RMSNorm → SwiGLU FFN +
    residual → RMSNorm → lm_head."""
    b = Builder("llama_block")
    tokens, pos = b.input("tokens", "i64", ["seq"]), b.input("positions", "i64", ["seq"])
    past_k, past_v = b.input("past_k", "f32", ["past", KV, HD]), b.input("past_v", "f32", ["past", KV, HD])
    x = b.op("Embedding", [tokens, b.weight("tok_embd", "f32", [VOCAB, D])], [("x", "f32", ["seq", D])])
    h = b.op("RMSNorm", [x, b.weight("attn_norm", "f32", [D])], [("h", "f32", ["seq", D])], eps=EPS)
    heads = {}
    for nm, n in (("q", H), ("k", KV), ("v", KV)):
        w = b.weight(f"attn_{nm}", weight_dtype, [n * HD, D])
        flat = b.op("MatMul", [h, w], [(f"{nm}_flat", "f32", ["seq", n * HD])], transpose_b=True)
        heads[nm] = b.op("Reshape", [flat], [(f"{nm}4", "f32", ["seq", n, HD])], shape=[0, n, HD])
    q = b.op("RoPE", [heads["q"], pos], [("q_rot", "f32", ["seq", H, HD])], mode="neox", theta=10000.0)
    k = b.op("RoPE", [heads["k"], pos], [("k_rot", "f32", ["seq", KV, HD])], mode="neox", theta=10000.0)
    att = b.op("Attention", [q, k, heads["v"], past_k, past_v],
               [("att", "f32", ["seq", H, HD]), ("present_k", "f32", ["total", KV, HD]),
                ("present_v", "f32", ["total", KV, HD])], n_heads=H, n_kv_heads=KV)
    att = b.op("Reshape", [att], [("att2", "f32", ["seq", H * HD])], shape=[0, -1])
    o = b.op("MatMul", [att, b.weight("attn_output", weight_dtype, [D, H * HD])], [("o", "f32", ["seq", D])],
             transpose_b=True)
    x = b.op("Add", [x, o], [("x2", "f32", ["seq", D])])
    h = b.op("RMSNorm", [x, b.weight("ffn_norm", "f32", [D])], [("h2", "f32", ["seq", D])], eps=EPS)
    gate = b.op("MatMul", [h, b.weight("ffn_gate", weight_dtype, [FF, D])], [("gate", "f32", ["seq", FF])],
                transpose_b=True)
    up = b.op("MatMul", [h, b.weight("ffn_up", weight_dtype, [FF, D])], [("up", "f32", ["seq", FF])],
              transpose_b=True)
    act = b.op("SwiGLU", [gate, up], [("act", "f32", ["seq", FF])])
    down = b.op("MatMul", [act, b.weight("ffn_down", weight_dtype, [D, FF])], [("down", "f32", ["seq", D])],
                transpose_b=True)
    x = b.op("Add", [x, down], [("x3", "f32", ["seq", D])])
    h = b.op("RMSNorm", [x, b.weight("output_norm", "f32", [D])], [("h3", "f32", ["seq", D])], eps=EPS)
    b.op("MatMul", [h, b.weight("output", "f32", [VOCAB, D])], [("logits", "f32", ["seq", VOCAB])], transpose_b=True)
    b.outputs += ["logits", "present_k", "present_v"]
    return check(b.build())


def random_weights(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in graph.weights:
        shape = tuple(int(d) for d in t.shape)
        scale = 1.0 if len(shape) == 1 else 1.0 / np.sqrt(shape[-1])
        out[t.name] = (rng.standard_normal(shape) * scale + (1.0 if len(shape) == 1 else 0.0)).astype(np.float32)
    return out


TOKENS = np.array([3, 17, 42, 8, 8, 29], np.int64)


def feeds(tokens: np.ndarray, start: int, past_k: np.ndarray | None = None,
          past_v: np.ndarray | None = None) -> dict[str, np.ndarray]:
    empty = np.zeros((0, KV, HD), np.float32)
    return {"tokens": tokens, "positions": np.arange(start, start + len(tokens), dtype=np.int64),
            "past_k": empty if past_k is None else past_k, "past_v": empty if past_v is None else past_v}


def test_decode_with_fed_back_cache_equals_longer_prefill() -> None:
    graph = llama_block()
    weights = random_weights(graph)
    prefill = evaluate(graph, feeds(TOKENS[:5], 0), weights)
    assert prefill["logits"].shape == (5, VOCAB) and prefill["present_k"].shape == (5, KV, HD)
    decode = evaluate(graph, feeds(TOKENS[5:], 5, prefill["present_k"], prefill["present_v"]),
                      lambda t: weights[t.name])
    full = evaluate(graph, feeds(TOKENS, 0), weights)
    assert decode["logits"].dtype == np.float32
    np.testing.assert_allclose(decode["logits"][0], full["logits"][-1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(decode["present_k"], full["present_k"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(prefill["logits"], full["logits"][:5], rtol=1e-5, atol=1e-5)


def test_block_quantized_weights_come_dequantized_from_the_callback() -> None:
    quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType as Q

    graph = llama_block(weight_dtype="q8_0")
    weights = random_weights(graph)
    packed = {name: quants.quantize(w, Q.Q8_0) for name, w in weights.items()
              if graph.tensor(name).dtype is DType.Q8_0}
    seen: list[str] = []

    def load(t: Tensor) -> np.ndarray:
        seen.append(t.name)
        return quants.dequantize(packed[t.name], Q.Q8_0) if t.name in packed else weights[t.name]

    out = evaluate(graph, feeds(TOKENS, 0), load)
    dense = evaluate(graph, feeds(TOKENS, 0), weights)
    assert sorted(seen) == sorted(weights)  # each weight fetched once
    np.testing.assert_allclose(out["logits"], dense["logits"], atol=0.1)  # q8_0 error, not a wrong graph
    assert not np.array_equal(out["logits"], dense["logits"])


def test_outputs_subset_runs_only_what_it_needs() -> None:
    graph = llama_block()
    weights = random_weights(graph)
    asked: list[str] = []
    out = evaluate(graph, feeds(TOKENS[:2], 0), lambda t: asked.append(t.name) or weights[t.name],
                   outputs=["v4", "tokens"])
    assert list(out) == ["v4", "tokens"] and out["v4"].shape == (2, KV, HD)
    assert sorted(asked) == ["attn_norm", "attn_v", "tok_embd"]  # nothing for q, k, attention, ffn, lm_head


def test_nodes_out_of_order_are_sorted() -> None:
    graph = llama_block()
    weights = random_weights(graph)
    shuffled = dataclasses.replace(graph, nodes=tuple(reversed(graph.nodes)))
    a = evaluate(graph, feeds(TOKENS[:3], 0), weights)["logits"]
    np.testing.assert_array_equal(evaluate(shuffled, feeds(TOKENS[:3], 0), weights)["logits"], a)
    n0, n1 = graph.nodes[0], graph.nodes[1]
    cyclic = dataclasses.replace(graph, nodes=(dataclasses.replace(n0, inputs=(n1.outputs[0], n0.inputs[1])),
                                               *graph.nodes[1:]))
    with pytest.raises(EvaluationError, match="cycle"):
        evaluate(cyclic, feeds(TOKENS[:3], 0), weights)


@pytest.mark.parametrize(("change", "message"), [
    ({"tokens": np.array([1, 2], np.int32)}, "input 'tokens'.*fed dtype int32; declared i64"),
    ({"positions": np.zeros((2, 1), np.int64)}, "input 'positions'.*rank 2"),
    ({"positions": np.arange(3, dtype=np.int64)}, r"input 'positions'.*shape \[3\].*seq = 2 so far"),
    ({"past_k": np.zeros((0, KV + 1, HD), np.float32)}, r"input 'past_k'.*declared \['past', 2, 8\]"),
    ({"bogus": np.zeros(1)}, "'bogus'.*not an input"),
])
def test_feeds_are_checked_against_declarations(change: dict[str, np.ndarray], message: str) -> None:
    graph = llama_block()
    with pytest.raises(EvaluationError, match=message):
        evaluate(graph, {**feeds(TOKENS[:2], 0), **change}, random_weights(graph))


def test_missing_feed_weight_and_failing_node_are_named() -> None:
    graph = llama_block()
    weights = random_weights(graph)
    partial = feeds(TOKENS[:2], 0)
    del partial["past_v"]
    with pytest.raises(EvaluationError, match="input 'past_v' is needed but was not fed"):
        evaluate(graph, partial, weights)
    with pytest.raises(EvaluationError, match=r"weight 'output'.*no array"):
        evaluate(graph, feeds(TOKENS[:2], 0), {k: v for k, v in weights.items() if k != "output"})
    with pytest.raises(EvaluationError, match=r"weight 'ffn_up'.*shape \[2, 2\]"):
        evaluate(graph, feeds(TOKENS[:2], 0), {**weights, "ffn_up": np.zeros((2, 2), np.float32)})
    with pytest.raises(EvaluationError, match=r"node 0 'x' \(Embedding\) in graph 'llama_block'.*out of range"):
        evaluate(graph, feeds(np.array([VOCAB], np.int64), 0), weights)
    with pytest.raises(EvaluationError, match="'nothing' is not a value"):
        evaluate(graph, feeds(TOKENS[:2], 0), weights, outputs=["nothing"])


def test_declared_shapes_and_dtypes_of_results() -> None:
    b = Builder("small")
    x = b.input("x", "f16", ["n", 4])
    w = b.weight("w", "f32", [4, 3])  # f32 weight, f16 activations
    y = b.op("MatMul", [x, w], [("y", "f16", ["n", 3])])
    r = b.op("MoERouter", [y], [("rw", "f32", ["n", 2]), ("ri", "i32", ["n", 2])], n_experts=3, top_k=2)
    c = b.tensor("c", "f16", [3], data=np.array([1, 2, 3], np.float16).tobytes())
    z = b.op("Add", [y, c], [("z", "f16", ["n", 5])])  # wrong declared shape
    b.outputs += [r, "ri", z]
    graph = b.build()
    xs = np.ones((2, 4), np.float16)
    out = evaluate(graph, {"x": xs}, {"w": np.ones((4, 3))}, outputs=["y", "ri"])
    assert out["y"].dtype == np.float16 and out["ri"].dtype == np.int32
    with pytest.raises(EvaluationError, match=r"'z' has shape \[2, 3\]; declared \['n', 5\]"):
        evaluate(graph, {"x": xs}, {"w": np.ones((4, 3))})
    assert evaluate(graph, {"x": xs}, {"w": np.ones((4, 3))}, check_shapes=False)["z"].tolist()[0] == [5, 6, 7]


def test_bf16_graph() -> None:
    b = Builder("bf16")
    x = b.input("x", "bf16", [2, 4])
    y = b.op("RMSNorm", [x, b.weight("w", "f32", [4])], [("y", "bf16", [2, 4])])
    b.outputs.append(y)
    from uaii.ir.reference import bf16_to_f32, f32_to_bf16

    xs = f32_to_bf16(np.array([[1, 2, 3, 4], [0.5, 0.5, 0.5, 0.5]], np.float32))
    with pytest.raises(EvaluationError, match="declared bf16"):
        evaluate(b.build(), {"x": bf16_to_f32(xs)}, {"w": np.ones(4, np.float32)})
    out = evaluate(b.build(), {"x": xs}, {"w": np.full(4, 2.0, np.float32)})["y"]
    assert out.dtype == np.uint16
    np.testing.assert_allclose(bf16_to_f32(out)[1], [2.0] * 4, rtol=1e-2)
