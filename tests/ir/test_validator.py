"""The validator: realistic graphs validate clean; a table of broken graphs triggers every diagnostic code."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from graph_builder import GraphBuilder, OutSpec

from uaii.ir import DType, Graph, Tensor, WeightRef
from uaii.ir.ops import FLOATS, OpSchema, Param
from uaii.ir.registry import Registry
from uaii.ir.validator import Code, ValidationError, check, validate


class Builder(GraphBuilder):
    """Names the nodes a test leaves unnamed op_index, as the diagnostics expect."""

    def __init__(self, name: str = "g") -> None:
        super().__init__(name, node_name=lambda op, output, index: f"{op.lower()}_{index}")


D, H, KV, HD, FF, VOCAB = 256, 4, 2, 64, 512, 1000


def _attention(b: Builder, p: str, h: str) -> str:
    for nm, rows in (("q", H * HD), ("k", KV * HD), ("v", KV * HD)):
        b.weight(f"{p}.attn_{nm}.weight", "q4_k", [rows, D])
        b.op("MatMul", [h, f"{p}.attn_{nm}.weight"], [(f"{p}.{nm}", "f32", ["seq", rows])],
             name=f"{p}.attn_{nm}", transpose_b=True)
    q = b.op("Reshape", [f"{p}.q"], [(f"{p}.q4", "f32", ["seq", H, HD])], shape=[0, H, HD])
    k = b.op("Reshape", [f"{p}.k"], [(f"{p}.k4", "f32", ["seq", KV, HD])], shape=[0, KV, -1])
    v = b.op("Reshape", [f"{p}.v"], [(f"{p}.v4", "f32", ["seq", KV, HD])], shape=[0, KV, HD])
    q = b.op("RoPE", [q, "positions"], [(f"{p}.q_rot", "f32", ["seq", H, HD])], theta=500000.0)
    k = b.op("RoPE", [k, "positions"], [(f"{p}.k_rot", "f32", ["seq", KV, HD])], theta=500000.0)
    past_k = b.input(f"{p}.past_k", "f32", ["past", KV, HD])
    past_v = b.input(f"{p}.past_v", "f32", ["past", KV, HD])
    att = b.op("Attention", [q, k, v, past_k, past_v],
               [(f"{p}.att", "f32", ["seq", H, HD]), (f"{p}.present_k", "f32", ["total", KV, HD]),
                (f"{p}.present_v", "f32", ["total", KV, HD])], n_heads=H, n_kv_heads=KV, head_dim=HD)
    b.outputs += [f"{p}.present_k", f"{p}.present_v"]
    att = b.op("Reshape", [att], [(f"{p}.att2", "f32", ["seq", H * HD])], shape=[0, -1])
    b.weight(f"{p}.attn_output.weight", "q4_k", [D, H * HD])
    return b.op("MatMul", [att, f"{p}.attn_output.weight"], [(f"{p}.o", "f32", ["seq", D])], transpose_b=True)


def _ffn(b: Builder, p: str, h: str) -> str:
    for nm in ("gate", "up"):
        b.weight(f"{p}.ffn_{nm}.weight", "q4_k", [FF, D])
        b.op("MatMul", [h, f"{p}.ffn_{nm}.weight"], [(f"{p}.{nm}", "f32", ["seq", FF])], transpose_b=True)
    act = b.op("SwiGLU", [f"{p}.gate", f"{p}.up"], [(f"{p}.act", "f32", ["seq", FF])])
    b.weight(f"{p}.ffn_down.weight", "q6_k", [D, FF])
    return b.op("MatMul", [act, f"{p}.ffn_down.weight"], [(f"{p}.down", "f32", ["seq", D])], transpose_b=True)


def llama(n_layers: int = 2) -> Graph:
    b = Builder("llama")
    b.input("tokens", "i32", ["seq"])
    b.input("positions", "i64", ["seq"])
    b.weight("token_embd.weight", "q4_k", [VOCAB, D])
    x = b.op("Embedding", ["tokens", "token_embd.weight"], [("x0", "f32", ["seq", D])])
    b.outputs.append("logits")
    for i in range(n_layers):
        p = f"blk.{i}"
        for norm in ("attn_norm", "ffn_norm"):
            b.weight(f"{p}.{norm}.weight", "f32", [D])
        h = b.op("RMSNorm", [x, f"{p}.attn_norm.weight"], [(f"{p}.h", "f32", ["seq", D])], eps=1e-5)
        x = b.op("Add", [x, _attention(b, p, h)], [(f"{p}.x_att", "f32", ["seq", D])])
        h = b.op("RMSNorm", [x, f"{p}.ffn_norm.weight"], [(f"{p}.h2", "f32", ["seq", D])], eps=1e-5)
        x = b.op("Add", [x, _ffn(b, p, h)], [(f"{p}.x_out", "f32", ["seq", D])])
    b.weight("output_norm.weight", "f32", [D])
    b.weight("output.weight", "q6_k", [VOCAB, D])
    h = b.op("RMSNorm", [x, "output_norm.weight"], [("h_out", "f32", ["seq", D])], eps=1e-5)
    b.op("MatMul", [h, "output.weight"], [("logits", "f32", ["seq", VOCAB])], name="lm_head",
         transpose_b=True)
    return b.build()


def moe(experts_op: str = "MoEExperts") -> Graph:
    b = Builder("moe")
    x = b.input("x", "f32", ["tokens", D])
    b.weight("ffn_gate_inp.weight", "f32", [8, D])
    logits = b.op("MatMul", [x, "ffn_gate_inp.weight"], [("router_logits", "f32", ["tokens", 8])],
                  transpose_b=True)
    b.op("MoERouter", [logits], [("rw", "f32", ["tokens", 2]), ("ri", "i32", ["tokens", 2])],
         n_experts=8, top_k=2, normalize=True)
    b.weight("ffn_gate_exps.weight", "q4_k", [8, FF, D])
    b.weight("ffn_up_exps.weight", "q4_k", [8, FF, D])
    b.weight("ffn_down_exps.weight", "q6_k", [8, D, FF])
    banks = ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"]
    y = b.op(experts_op, [x, "rw", "ri", *banks], [("moe_out", "f32", ["tokens", D])], n_experts=8, top_k=2)
    b.outputs.append(b.op("Add", [x, y], [("y", "f32", ["tokens", D])]))
    return b.build()


def cpp_demo() -> Graph:
    """The layout of the C++ runtime's tiny GGUF demo: f32 token ids, batch-1 shapes declared loosely."""
    b = Builder("tiny_lm")
    b.input("tokens", "f32", [1, 1])
    b.weight("token_embd.weight", "f32", [10, 4])
    b.weight("output_norm.weight", "f32", [4])
    b.weight("output.weight", "f32", [10, 4])
    h = b.op("Embedding", ["tokens", "token_embd.weight"], [("hidden", "f32", [1, 4])])
    h = b.op("RMSNorm", [h, "output_norm.weight"], [("normed", "f32", [1, 4])], eps=1e-5)
    h = b.op("MatMul", [h, "output.weight"], [("logits", "f32", [1, 10])], transpose_b=True)
    b.outputs.append(b.op("Softmax", [h], [("probs", "f32", [1, 10])], axis=-1))
    return b.build()


@pytest.mark.parametrize("make", [llama, moe, lambda: moe("MoEExpertsSwiGLU"), cpp_demo])
def test_realistic_graphs_are_valid(make: Callable[[], Graph]) -> None:
    g = make()
    assert validate(g) == []
    assert check(g) is g


# --- broken graphs  ---------------------------------------------------------------------------------------
def base() -> Builder:
    """x [seq, 256] @ w^T (q4_k [512, 256]) -> h [seq, 512] -> Silu -> y."""
    b = Builder("tiny")
    b.input("x", "f32", ["seq", 256])
    b.weight("w", "q4_k", [512, 256])
    b.op("MatMul", ["x", "w"], [("h", "f32", ["seq", 512])], name="fc", transpose_b=True)
    b.outputs.append(b.op("Silu", ["h"], [("y", "f32", ["seq", 512])], name="act"))
    return b


def with_node(b: Builder, i: int, **changes: Any) -> Graph:
    b.nodes[i] = dataclasses.replace(b.nodes[i], **changes)
    return b.build()


def retensor(b: Builder, name: str, **changes: Any) -> Graph:
    b.tensors[name] = dataclasses.replace(b.tensors[name], **changes)
    return b.build()


def add_node(b: Builder, op: str, inputs: Sequence[str], outputs: Sequence[OutSpec], **attrs: Any) -> Graph:
    b.op(op, inputs, outputs, **attrs)
    return b.build()


def bad_ref() -> Graph:
    b = base()
    ref = WeightRef("model.gguf", "w")
    object.__setattr__(ref, "tensor", "")  # bypass the constructor's checks, as a buggy producer might
    return retensor(b, "w", weight=ref)


def cycle() -> Graph:
    b = base()
    b.nodes[0] = dataclasses.replace(b.nodes[0], inputs=("y", "w"))
    return b.build()


def empty_weight_name() -> Graph:
    b = base()
    b.tensors["w"] = Tensor("", DType.Q4_K, (512, 256), weight=WeightRef("model.gguf", "w"))
    return b.build()


def shared_ref() -> Graph:
    b = base()
    b.weight("w2", "q4_k", [512, 512])
    b.tensors["w2"] = dataclasses.replace(b.tensors["w2"], weight=WeightRef("model.gguf", "w"))
    return add_node(b, "MatMul", ["y", "w2"], [("z", "f32", ["seq", 512])], transpose_b=True)


def constant_reshape() -> Graph:
    b = base()
    b.tensors["shape"] = Tensor.constant("shape", np.array([0, 8, 64], dtype=np.int64))
    return add_node(b, "Reshape", ["h", "shape"], [("r", "f32", ["seq", 8, 64])])


def crashing() -> tuple[Graph, Registry]:
    reg = Registry(plugins=False)
    reg.register(OpSchema("Crash", 1, "always fails", inputs=(Param("X", "T", "x"),),
                          outputs=(Param("Y", "T", "y"),), types={"T": FLOATS},
                          infer=lambda ctx: [ctx.shape(0)[99]]))
    return add_node(base(), "Crash", ["y"], [("z", "f32", ["seq", 512])]), reg


def dtype_mix() -> Graph:
    b = base()
    b.input("y16", "f16", ["seq", 512])
    return add_node(b, "Add", ["y", "y16"], [("z", "f32", ["seq", 512])])


def declared_undefined() -> Graph:
    b = base()
    b.tensor("lonely", "f32", ["seq", 512])
    return add_node(b, "Relu", ["lonely"], [("z", "f32", ["seq", 512])])


def produced_constant() -> Graph:
    b = base()
    b.op("Relu", ["y"], [("k", "f32", ["seq", 512])])
    b.tensors["k"] = Tensor.constant("k", np.ones(4, dtype=np.float32))
    return b.build()


def unproduced_output() -> Graph:
    b = base()
    b.tensor("extra", "f32", [4])
    b.outputs.append("extra")
    return b.build()


def duplicate_tensor() -> Graph:
    g = base().build()
    return dataclasses.replace(g, tensors=(*g.tensors, Tensor("h", DType.F32, ("seq", 512))))


def empty_tensor_name() -> Graph:
    g = base().build()
    return dataclasses.replace(g, tensors=(*g.tensors, Tensor("", DType.F32, (4,))))


def graph_input(name: str) -> Graph:
    g = base().build()
    return dataclasses.replace(g, inputs=(*g.inputs, name))


CASES: list[tuple[str, Callable[[], Graph], str]] = [
    ("unknown op", lambda: with_node(base(), 1, op="Frobnicate"), Code.UNKNOWN_OP),
    ("unknown version", lambda: with_node(base(), 1, version=7), Code.UNKNOWN_OP),
    ("too few inputs", lambda: with_node(base(), 0, inputs=("x",)), Code.ARITY),
    ("required input left empty", lambda: with_node(base(), 0, inputs=("x", "")), Code.ARITY),
    ("too many outputs", lambda: with_node(base(), 1, outputs=("y", "h")), Code.ARITY),
    ("attr type", lambda: with_node(base(), 0, attributes={"transpose_b": "yes"}), Code.ATTR_TYPE),
    ("attr choice", lambda: with_node(base(), 1, op="Gelu", attributes={"approximate": "fast"}),
     Code.ATTR_RANGE),
    ("axis out of range", lambda: with_node(base(), 1, op="Softmax", attributes={"axis": 2}),
     Code.ATTR_RANGE),
    ("reduce axis out of range", lambda: add_node(base(), "ReduceMean", ["y"], [("m", "f32", [1, 512])],
                                                  axes=[2]), Code.ATTR_RANGE),
    ("reduce axis twice", lambda: add_node(base(), "ReduceMean", ["y"], [("m", "f32", [1, 1])], axes=[0, -2]),
     Code.ATTR_RANGE),
    ("attr unknown", lambda: with_node(base(), 0, attributes={"transpose_b": True, "foo": 1}),
     Code.ATTR_UNKNOWN),
    ("attr missing", lambda: add_node(base(), "Concat", ["h", "y"], [("c", "f32", ["seq", 1024])]),
     Code.ATTR_MISSING),
    ("dtype mix", dtype_mix, Code.DTYPE),
    ("dtype constraint", lambda: retensor(base(), "x", dtype=DType.I32), Code.DTYPE),
    ("block misaligned", lambda: retensor(base(), "w", shape=(512, 100)), Code.DTYPE),
    ("cast output dtype", lambda: add_node(base(), "Cast", ["y"], [("z", "f32", ["seq", 512])], to="f16"),
     Code.DTYPE),
    ("inner dims", lambda: retensor(base(), "w", shape=(512, 512)), Code.SHAPE),
    ("broadcast", lambda: add_node(base(), "Add", ["y", "x"], [("z", "f32", ["seq", 512])]), Code.SHAPE),
    ("declared vs inferred", lambda: retensor(base(), "y", shape=("seq", 256)), Code.SHAPE),
    ("undefined input", lambda: with_node(base(), 1, inputs=("ghost",)), Code.UNDEFINED_VALUE),
    ("declared, never defined", declared_undefined, Code.UNDEFINED_VALUE),
    ("undeclared output", lambda: with_node(base(), 1, outputs=("y_undeclared",)), Code.UNDECLARED),
    ("two producers", lambda: add_node(base(), "Relu", ["h"], [("y", "f32", ["seq", 512])]),
     Code.MULTIPLE_PRODUCERS),
    ("produced constant", produced_constant, Code.MULTIPLE_PRODUCERS),
    ("cycle", cycle, Code.CYCLE),
    ("output not produced", unproduced_output, Code.OUTPUT_NOT_PRODUCED),
    ("duplicate tensor", duplicate_tensor, Code.DUPLICATE_NAME),
    ("duplicate node", lambda: with_node(base(), 1, name="fc"), Code.DUPLICATE_NAME),
    ("empty tensor name", empty_tensor_name, Code.EMPTY_NAME),
    ("weight produced", lambda: with_node(base(), 1, outputs=("w",)), Code.WEIGHT_REF),
    ("weight symbolic", lambda: retensor(base(), "w", shape=("n", 256)), Code.WEIGHT_REF),
    ("weight ref malformed", bad_ref, Code.WEIGHT_REF),
    ("weight empty name", empty_weight_name, Code.WEIGHT_REF),
    ("weight ref shared", shared_ref, Code.WEIGHT_REF),
    ("input is weight", lambda: graph_input("w"), Code.GRAPH_INPUT),
    ("input undeclared", lambda: graph_input("nothing"), Code.GRAPH_INPUT),
    ("input produced", lambda: graph_input("h"), Code.GRAPH_INPUT),
]


@pytest.mark.parametrize("make, code", [(m, c) for _, m, c in CASES], ids=[n for n, _, _ in CASES])
def test_broken_graph_reports_code(make: Callable[[], Graph], code: str) -> None:
    diags = validate(make())
    assert code in {d.code for d in diags}, [d.message for d in diags]
    for d in diags:
        assert d.message.startswith("[validate] ") and d.graph == "tiny"


def test_infer_crash_is_a_diagnostic() -> None:
    graph, reg = crashing()
    diags = validate(graph, reg)
    assert [d.code for d in diags] == [Code.INFER_ERROR]
    assert "IndexError" in diags[0].message


def test_every_code_is_exercised() -> None:
    assert {c for _, _, c in CASES} | {Code.INFER_ERROR} == set(Code)


def test_message_names_node_op_and_graph() -> None:
    [d] = validate(retensor(base(), "w", shape=(512, 512)))
    assert d.message.startswith("[validate] node 0 'fc' (MatMul) in graph 'tiny': inner dimensions differ")
    assert (d.code, d.node, d.op, d.index, d.graph) == ("shape", "fc", "MatMul", 0, "tiny")


def test_collects_every_problem_and_check_raises() -> None:
    b = base()
    b.nodes[1] = dataclasses.replace(b.nodes[1], op="Frobnicate")
    b.nodes[0] = dataclasses.replace(b.nodes[0], attributes={"transpose_b": True, "foo": 1})
    b.tensor("extra", "f32", [4])
    b.outputs.append("extra")
    g = b.build()
    with pytest.raises(ValidationError) as e:
        check(g)
    assert e.value.codes == {"unknown-op", "attr-unknown", "output-not-produced"}
    assert str(e.value).startswith("[validate] graph 'tiny' failed validation with 3 problems:")
    assert e.value.diagnostics == tuple(validate(g))


def test_errors_do_not_cascade_and_constants_feed_inference() -> None:
    g = retensor(base(), "w", shape=(512, 512))  # fc is wrong, but its declared output keeps act checkable
    assert [d.node for d in validate(g)] == ["fc"]
    assert validate(constant_reshape()) == []


def test_unsorted_nodes_are_fine() -> None:
    g = llama(1)
    assert validate(dataclasses.replace(g, nodes=tuple(reversed(g.nodes)))) == []


def test_undeclared_intermediates_still_propagate_types() -> None:
    b = base()
    del b.tensors["h"]
    b.nodes[1] = dataclasses.replace(b.nodes[1], op="Softmax", attributes={"axis": 5})
    codes = sorted(d.code for d in validate(b.build()))
    assert codes == ["attr-range", "undeclared"]  # Softmax still saw h's inferred [seq, 512]
