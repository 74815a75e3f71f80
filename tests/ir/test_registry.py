"""The op registry: built-in schemas, the named op sets, registration rules, shape inference per op, docs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from uaii.ir import DType, Node, UaiiError
from uaii.ir.ops import (
    BUILTIN_SCHEMAS,
    CPP_RUNTIME_OPS,
    ELEMENTWISE,
    FLOATS,
    FUSED_SCHEMAS,
    GROUPS,
    WEIGHT_TYPES,
    InferCtx,
    InferError,
    Op,
    OpKind,
    OpSchema,
    Param,
    TensorType,
    float_attr,
    int_attr,
)
from uaii.ir.ops.schema import fmt_types
from uaii.ir.registry import Registry, RegistryError, UnknownOpError, default_registry, render_markdown
from uaii.ir.shapes import (
    ShapeError,
    broadcast_shapes,
    dim_add,
    dim_div,
    dim_mul,
    dim_prod,
    quotient,
    reshape_shape,
    shapes_compatible,
)

F32, F16, I32, I64, Q4K = DType.F32, DType.F16, DType.I32, DType.I64, DType.Q4_K


# --- the built-in op set  ---------------------------------------------------------------------------------
def test_every_op_has_one_version_1_schema() -> None:
    reg = default_registry()
    assert {s.op for s in BUILTIN_SCHEMAS} == {str(o) for o in Op}
    assert len(BUILTIN_SCHEMAS) == len(Op)
    for op in Op:
        assert reg.get(op, 1).op == op


def test_cpp_runtime_names_resolve() -> None:
    names = ("MatMul MatMulRelu Add Mul Relu Silu Gelu Softmax LayerNorm RMSNorm Reshape Transpose Concat "
             "Split Cast Identity Attention RoPE Embedding MoERouter MoEExperts MoEExpertsSwiGLU")
    for name in names.split():
        assert name in CPP_RUNTIME_OPS
        assert default_registry().find(name, 1) is not None, name


def test_named_sets_match_schema_properties() -> None:
    reg = default_registry()
    for kind, ops in GROUPS.items():
        for op in ops:
            assert reg.get(op).kind is OpKind(kind), op
    assert {s.op for s in BUILTIN_SCHEMAS if s.elementwise} == set(ELEMENTWISE)
    assert "Add" in ELEMENTWISE and "MatMul" not in ELEMENTWISE  # plain strings work against the sets


def test_schemas_are_documented() -> None:
    for s in BUILTIN_SCHEMAS:
        assert len(s.doc) >= 7, s.op
        assert all(p.doc for p in (*s.inputs, *s.outputs)), s.op
        assert all(a.doc for a in s.attrs), s.op


def test_render_markdown_lists_every_op() -> None:
    md = render_markdown(builtin_only=True)
    assert md == render_markdown(builtin_only=True)
    for op in Op:
        assert f"## {op} (version 1)" in md
    assert "| transpose_b | bool | False |" in md
    summary = [line for line in md.splitlines() if line.startswith("| [")]
    assert len(summary) == len(Op) + len(FUSED_SCHEMAS)  # the planner's fused ops are registered too
    assert all(line.count(" | ") == 5 for line in summary)  # pipes inside cells are escaped


# --- registration  ----------------------------------------------------------------------------------------
def _scale(version: int = 1, doc: str = "Y = X * factor.") -> OpSchema:
    return OpSchema("Scale", version, doc, inputs=(Param("X", "T", "in"),), outputs=(Param("Y", "T", "out"),),
                    attrs=(float_attr("factor", 1.0, "multiplier"),), types={"T": FLOATS},
                    infer=lambda ctx: [ctx.shape(0)])


def test_register_find_versions_and_conflicts() -> None:
    reg = Registry(plugins=False)
    v1 = reg.register(_scale())
    assert reg.register(v1) is v1  # the same schema again is a no-op
    reg.register(_scale(2))
    assert reg.versions("Scale") == (1, 2) and reg.latest("Scale").version == 2
    assert ("Scale", 2) in reg and "Scale" in reg and ("Scale", 3) not in reg
    with pytest.raises(RegistryError, match="already registered"):
        reg.register(_scale(1, "something else"))
    reg.register(_scale(1, "replaced"), replace=True)
    assert reg.get("Scale").doc == "replaced"
    with pytest.raises(UnknownOpError, match="registered versions: 1, 2"):
        reg.get("Scale", 3)
    with pytest.raises(UnknownOpError, match="no version of it"):
        reg.get("Nope")


def test_runtime_registrations_survive_refresh() -> None:
    reg = Registry(plugins=False)
    reg.register(_scale())
    reg.refresh()
    assert reg.find("Scale") is not None and reg.find("MatMul") is not None
    assert reg.source("Scale") == "register() at run time"
    with pytest.raises(RegistryError, match="built-in ops of uaii-ir"):
        reg.register(OpSchema("MatMul", 1, "not the real one", inputs=(), outputs=()))


@pytest.mark.parametrize("kwargs, match", [
    ({"inputs": (Param("X", "U"),)}, "undeclared type"),
    ({"inputs": (Param("X", "T", variadic=True), Param("Y", "T"))}, "only the last"),
    ({"inputs": (Param("X", "T", optional=True), Param("Y", "T"))}, "follows an optional"),
    ({"attrs": (int_attr("k", -1, "k", min=0),)}, "default of attribute 'k'"),
    ({"version": 0}, "version >= 1"),
])
def test_malformed_schemas_are_rejected(kwargs: dict[str, Any], match: str) -> None:
    base: dict[str, Any] = {"op": "Bad", "version": 1, "doc": "d", "inputs": (), "outputs": (),
                            "types": {"T": FLOATS}}
    with pytest.raises(UaiiError, match=match):
        OpSchema(**{**base, **kwargs})


def test_attribute_coercion_and_ranges() -> None:
    s = default_registry().get("RoPE")
    node = Node("r", "RoPE", ("x", "p"), ("y",), {"theta": 10000, "rotary_dims": 64, "mode": "neox"})
    values, problems = s.resolve_attrs(node)
    assert problems == [] and values["theta"] == 10000.0 and isinstance(values["theta"], float)
    assert values["scaling_type"] == "none"  # defaults filled in
    mm = default_registry().get("MatMul")
    values, problems = mm.resolve_attrs(Node("m", "MatMul", ("a", "b"), ("y",), {"transpose_b": 1}))
    assert problems == [] and values["transpose_b"] is True  # int 0/1 accepted for bool (ONNX style)
    _, problems = mm.resolve_attrs(Node("m", "MatMul", ("a", "b"), ("y",), {"transpose_b": 2}))
    assert [c for c, _ in problems] == ["attr-type"]
    _, problems = s.resolve_attrs(Node("r", "RoPE", ("x", "p"), ("y",), {"theta": -1.0, "mode": "x"}))
    assert sorted(c for c, _ in problems) == ["attr-range", "attr-range"]


# --- symbolic shapes --------------------------------------------------------------------------------------
def test_symbolic_dim_arithmetic() -> None:
    assert dim_add("past", "seq") == dim_add("seq", "past") == "past_plus_seq"
    assert dim_add(0, "seq") == "seq" and dim_add(3, 4) == 7
    assert dim_mul("seq", 1) == "seq" and dim_mul(4, 8) == 32
    assert dim_div("n", "n") == 1 and dim_div(12, 4) == 3
    with pytest.raises(ShapeError):
        dim_div(10, 4)
    assert dim_prod([4, "seq", 2]) == "seq_times_8"
    assert quotient(["seq", 4, 64], ["seq", 4]) == 64
    assert quotient(["seq", 256], [4]) == "seq_times_64"
    assert dim_div(256, "heads") == "_256_div_heads" and "_256_div_heads".isidentifier()
    with pytest.raises(ShapeError):
        quotient([10], [4])


def test_broadcast_and_compatibility() -> None:
    assert broadcast_shapes(("seq", 1, 64), (4, 1)) == ("seq", 4, 64)
    assert broadcast_shapes(("seq", 64), ("seq", 64)) == ("seq", 64)
    assert broadcast_shapes(("b",), ("a",)) == ("a_max_b",)
    assert broadcast_shapes(("n",), (8,)) == (8,)
    with pytest.raises(ShapeError, match="do not broadcast"):
        broadcast_shapes((3, 4), (5, 4))
    assert shapes_compatible(("seq", 4), (7, 4)) and not shapes_compatible((3, 4), (5, 4))
    assert shapes_compatible((1, 4), (1, 1, 4))  # the batch-1 rule
    assert not shapes_compatible(("batch", 4), (4,))


def test_reshape_targets() -> None:
    assert reshape_shape(("seq", 256), (0, 4, 64)) == ("seq", 4, 64)
    assert reshape_shape(("seq", 4, 64), (0, -1)) == ("seq", 256)
    assert reshape_shape((6, 4), (-1,)) == (24,)
    with pytest.raises(ShapeError, match="element counts differ"):
        reshape_shape((6, 4), (5, 5))
    with pytest.raises(ShapeError, match="more than one -1"):
        reshape_shape((6, 4), (-1, -1))
    with pytest.raises(ShapeError):
        reshape_shape((6, 4), (-1, 5))


# --- shape inference per op -------------------------------------------------------------------------------
def infer(op: str, inputs: Sequence[TensorType | None], n_outputs: int = 1,
          consts: dict[int, np.ndarray] | None = None, **attrs: Any) -> list[Any]:
    schema = default_registry().get(op)
    names = tuple(f"i{k}" if t is not None else "" for k, t in enumerate(inputs))
    node = Node("n", op, names, tuple(f"o{k}" for k in range(n_outputs)), attrs)
    values, problems = schema.resolve_attrs(node)
    assert not problems, problems
    ctx = InferCtx(node, schema, inputs, values, consts)
    assert schema.infer is not None
    shapes = list(schema.infer(ctx))
    if schema.dtypes is not None:
        return [shapes, list(schema.dtypes(ctx))]
    return shapes


def T(dtype: DType, *shape: int | str) -> TensorType:
    return TensorType(dtype, tuple(shape))


def test_matmul_and_gemm_shapes() -> None:
    assert infer("MatMul", [T(F32, "seq", 256), T(Q4K, 512, 256)], transpose_b=True) == [("seq", 512)]
    assert infer("MatMul", [T(F32, 2, "seq", 8), T(F32, 8, 3)]) == [(2, "seq", 3)]
    assert infer("MatMul", [T(F32, 8), T(F32, 8, 3)]) == [(3,)]
    with pytest.raises(InferError, match="inner dimensions differ"):
        infer("MatMul", [T(F32, "seq", 256), T(Q4K, 512, 128)], transpose_b=True)
    assert infer("Gemm", [T(F32, 8, 4), T(F32, 5, 8), T(F32, 5)], transA=True, transB=True) == [(4, 5)]
    with pytest.raises(InferError, match="does not broadcast"):
        infer("Gemm", [T(F32, 4, 8), T(F32, 8, 5), T(F32, 3)])


def test_attention_and_rope_shapes() -> None:
    q, k = T(F32, "seq", 8, 64), T(F32, "seq", 2, 64)
    past = T(F32, "past", 2, 64)
    out = infer("Attention", [q, k, k, past, past], 3, n_heads=8, n_kv_heads=2)
    assert out == [("seq", 8, 64), ("past_plus_seq", 2, 64), ("past_plus_seq", 2, 64)]
    assert infer("Attention", [q, k, k], 1) == [("seq", 8, 64)]
    with pytest.raises(InferError, match="not a multiple") as e:
        infer("Attention", [q, k, k], n_heads=8, n_kv_heads=3)
    assert e.value.code == "attr-range"
    with pytest.raises(InferError, match="together"):
        infer("Attention", [q, k, k, past, None])
    assert infer("RoPE", [q, T(I64, "seq")], rotary_dims=32, mode="neox") == [("seq", 8, 64)]
    with pytest.raises(InferError, match="exceeds head_dim"):
        infer("RoPE", [q, T(I32, "seq")], rotary_dims=128)
    with pytest.raises(InferError, match="original_max_position"):
        infer("RoPE", [q, T(I32, "seq")], scaling_type="llama3", factor=8.0)
    assert infer("RoPE", [q, T(I32, "seq"), T(F32, 32)], scaling_type="llama3", factor=8.0,
                 original_max_position=8192) == [("seq", 8, 64)]


def test_movement_shapes() -> None:
    assert infer("Reshape", [T(F32, "seq", 256)], shape=[0, 4, -1]) == [("seq", 4, 64)]
    const = {1: np.array([0, 8, 32], dtype=np.int64)}
    assert infer("Reshape", [T(F32, "seq", 256), T(I64, 3)], consts=const) == [("seq", 8, 32)]
    assert infer("Transpose", [T(F32, "a", "b", 3)], perm=[2, 0, 1]) == [(3, "a", "b")]
    assert infer("Transpose", [T(F32, 2, 3)]) == [(3, 2)]
    assert infer("Concat", [T(F32, "s", 4), T(F32, "s", 6), T(F32, "s", 2)], axis=-1) == [("s", 12)]
    assert infer("Concat", [T(F32, "past", 4), T(F32, "seq", 4)], axis=0) == [("past_plus_seq", 4)]
    assert infer("Split", [T(F32, "s", 12)], 3, axis=1) == [("s", 4)] * 3
    assert infer("Split", [T(F32, "s", 12)], 2, axis=1, split=[4, 8]) == [("s", 4), ("s", 8)]
    assert infer("Slice", [T(F32, 10, "s")], starts=[2, 0], ends=[-1, 1 << 40], axes=[0, 1]) == [(7, "s")]
    assert infer("Slice", [T(F32, 10)], starts=[0], ends=[10], steps=[3]) == [(4,)]


def test_index_reduce_moe_glu_shapes() -> None:
    shapes, dtypes = infer("Embedding", [T(F32, 1, "seq"), T(Q4K, 1000, 256)])
    assert shapes == [(1, "seq", 256)] and dtypes == [None]
    assert infer("Embedding", [T(I32, "seq"), T(F16, 10, 4)]) == [[("seq", 4)], [F16]]
    assert infer("Gather", [T(Q4K, 10, 256), T(I64, "n")], axis=0) == [("n", 256)]
    with pytest.raises(InferError, match="innermost axis"):
        infer("Gather", [T(Q4K, 10, 256), T(I64, "n")], axis=1)
    assert infer("TopK", [T(F32, "s", 100)], 2, k=5) == [("s", 5), ("s", 5)]
    assert infer("ArgMax", [T(F32, "s", 100)], keepdims=False) == [("s",)]
    assert infer("MoERouter", [T(F32, "t", 8)], 2, n_experts=8, top_k=2) == [("t", 2), ("t", 2)]
    banks = [T(Q4K, 8, 512, 256), T(Q4K, 8, 512, 256), T(DType.Q6_K, 8, 256, 512)]
    args = [T(F32, "t", 256), T(F32, "t", 2), T(I32, "t", 2), *banks]
    assert infer("MoEExperts", args, n_experts=8, top_k=2) == [("t", 256)]
    with pytest.raises(InferError, match="down bank"):
        infer("MoEExperts", [*args[:5], T(Q4K, 8, 256, 256)], n_experts=8, top_k=2)
    assert infer("SwiGLU", [T(F32, "s", 1024)]) == [("s", 512)]
    assert infer("GeGLU", [T(F32, "s", 8), T(F32, "s", 8)], approximate="tanh") == [("s", 8)]
    assert infer("Cast", [T(Q4K, 4, 256)], to="float16") == [[(4, 256)], [F16]]


def test_reduce_mean_schema_and_shapes() -> None:
    rm = default_registry().get("ReduceMean")
    assert rm.kind is OpKind.REDUCE and not rm.elementwise and rm.allowed(rm.inputs[0]) == FLOATS
    assert [(a.name, a.default) for a in rm.attrs] == [("axes", None), ("keepdims", True)]
    assert infer("ReduceMean", [T(F32, "seq", 32)], axes=[0]) == [(1, 32)]
    assert infer("ReduceMean", [T(F32, "seq", 32)], axes=[-2], keepdims=0) == [(32,)]
    assert infer("ReduceMean", [T(F16, 2, "s", 4)], axes=[2, 0], keepdims=1) == [(1, "s", 1)]
    assert infer("ReduceMean", [T(F32, 2, "s", 4)]) == [(1, 1, 1)]  # no axes: every axis, as in ONNX
    assert infer("ReduceMean", [T(F32, 2, "s", 4)], axes=[], keepdims=False) == [()]
    for axes, match in (([2], "out of range"), ([-3], "out of range"), ([1, -1], "twice")):
        with pytest.raises(InferError, match=match) as e:
            infer("ReduceMean", [T(F32, "seq", 32)], axes=axes)
        assert e.value.code == "attr-range"
    assert rm.check_dtypes([I32], [None]) == ["input #0 ('X') has dtype i32; expected bf16, f16 or f32"]
    _, problems = rm.resolve_attrs(Node("m", "ReduceMean", ("x",), ("y",), {"keepdims": 2}))
    assert [c for c, _ in problems] == ["attr-type"]


def test_dtype_constraints() -> None:
    mm = default_registry().get("MatMul")
    assert mm.check_dtypes([F32, Q4K], [F32]) == []
    assert mm.check_dtypes([F16, F32], [F16]) == []
    assert "expected bf16, f16 or f32" in mm.check_dtypes([I32, F32], [None])[0]
    assert "both are type T" in mm.check_dtypes([F32, Q4K], [F16])[0]
    emb = default_registry().get("Embedding")
    assert emb.check_dtypes([F32, Q4K], [F32]) == []  # the C++ runtime's f32 token ids
    assert fmt_types(WEIGHT_TYPES) == "bf16, f16, f32 or any block-quantized type"
