"""The fused ops the planner produces (uaii.ir.ops.fused): schemas, shape inference, validation, references."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from uaii.ir import DType, Node, Tensor, WeightRef, make_graph
from uaii.ir.ops import BUILTIN_SCHEMAS, FUSED_SCHEMAS, InferCtx, InferError, Op, OpKind, TensorType
from uaii.ir.ops.fused import ADD_RMS_NORM_OP, FUSED_OPS, GROUPED_MATMUL_OP
from uaii.ir.reference import run_node
from uaii.ir.registry import default_registry
from uaii.ir.validator import validate

F32, F16, Q4K, Q6K = DType.F32, DType.F16, DType.Q4_K, DType.Q6_K
RNG = np.random.default_rng(0)


def infer(op: str, inputs: Sequence[tuple[DType, tuple[int | str, ...]]], n_out: int, **attrs: Any) -> list[Any]:
    schema = default_registry().get(op)
    node = Node("n", op, tuple(f"i{k}" for k in range(len(inputs))), tuple(f"o{k}" for k in range(n_out)), attrs)
    values, problems = schema.resolve_attrs(node)
    assert not problems
    assert schema.infer is not None
    return list(schema.infer(InferCtx(node, schema, [TensorType(d, s) for d, s in inputs], values)))


def test_fused_ops_are_registered_documented_and_not_in_the_op_enum() -> None:
    reg = default_registry()
    assert {s.op for s in FUSED_SCHEMAS} == FUSED_OPS == {GROUPED_MATMUL_OP, ADD_RMS_NORM_OP}
    for s in FUSED_SCHEMAS:
        assert reg.get(s.op, 1) is s
        assert s.op not in {str(o) for o in Op} and s not in BUILTIN_SCHEMAS
        assert len(s.doc) > 40 and all(p.doc for p in (*s.inputs, *s.outputs)) and all(a.doc for a in s.attrs)
    assert reg.get(GROUPED_MATMUL_OP).kind is OpKind.LINALG and reg.get(ADD_RMS_NORM_OP).kind is OpKind.NORM
    assert not reg.get(GROUPED_MATMUL_OP).fusible  # already fused


# --- GroupedMatMul -------------------------------------------------------------------------------------------
def test_grouped_matmul_infers_one_shape_per_weight() -> None:
    out = infer(GROUPED_MATMUL_OP, [(F32, ("seq", 256)), (Q4K, (512, 256)), (Q4K, (128, 256)), (Q4K, (128, 256))],
                3, transpose_b=True)
    assert out == [("seq", 512), ("seq", 128), ("seq", 128)]
    assert infer(GROUPED_MATMUL_OP, [(F32, (2, 8)), (F32, (8, 3)), (F32, (8, 5))], 2) == [(2, 3), (2, 5)]


def test_grouped_matmul_rejects_a_count_mismatch_and_a_wrong_inner_dim() -> None:
    with pytest.raises(InferError, match="2 weights but 3 outputs") as e:
        infer(GROUPED_MATMUL_OP, [(F32, (2, 8)), (F32, (4, 8)), (F32, (4, 8))], 3, transpose_b=True)
    assert e.value.code == "arity"
    with pytest.raises(InferError, match=r"weight #1: inner dimensions differ"):
        infer(GROUPED_MATMUL_OP, [(F32, (2, 8)), (F32, (4, 8)), (F32, (4, 9))], 2, transpose_b=True)


def _graph(nodes: list[Node], tensors: list[Tensor], inputs: list[str], outputs: list[str]) -> Any:
    return make_graph("g", nodes, tensors, inputs, outputs)


def _w(name: str, dtype: DType, shape: tuple[int, ...]) -> Tensor:
    return Tensor(name, dtype, shape, weight=WeightRef("m.gguf", name))


def test_grouped_matmul_validates_and_needs_one_weight_dtype() -> None:
    def graph(dt_v: DType) -> Any:
        tensors = [Tensor("x", F32, ("seq", 256)), _w("wq", Q4K, (256, 256)), _w("wv", dt_v, (64, 256)),
                   Tensor("q", F32, ("seq", 256)), Tensor("v", F32, ("seq", 64))]
        node = Node("qv", GROUPED_MATMUL_OP, ("x", "wq", "wv"), ("q", "v"), {"transpose_b": True})
        return _graph([node], tensors, ["x"], ["q", "v"])

    assert validate(graph(Q4K)) == []
    codes = {d.code for d in validate(graph(Q6K))}
    assert codes == {"dtype"}


def test_grouped_matmul_needs_two_weights() -> None:
    tensors = [Tensor("x", F32, (2, 8)), _w("w", F32, (4, 8)), Tensor("y", F32, (2, 4))]
    node = Node("one", GROUPED_MATMUL_OP, ("x", "w"), ("y",), {"transpose_b": True})
    assert {d.code for d in validate(_graph([node], tensors, ["x"], ["y"]))} == {"arity"}


def test_grouped_matmul_reference_equals_separate_matmuls() -> None:
    a, w1, w2 = RNG.standard_normal((3, 8)), RNG.standard_normal((5, 8)), RNG.standard_normal((7, 8))
    a, w1, w2 = (x.astype(np.float32) for x in (a, w1, w2))
    node = Node("g", GROUPED_MATMUL_OP, ("a", "w1", "w2"), ("y1", "y2"), {"transpose_b": True})
    y1, y2 = run_node(node, [a, w1, w2])
    for y, w in ((y1, w1), (y2, w2)):
        (ref,) = run_node(Node("m", "MatMul", ("a", "w"), ("y",), {"transpose_b": True}), [a, w])
        np.testing.assert_array_equal(y, ref)


# --- AddRMSNorm ----------------------------------------------------------------------------------------------
def test_add_rmsnorm_infers_the_sum_and_the_normalized_value() -> None:
    assert infer(ADD_RMS_NORM_OP, [(F32, ("seq", 64)), (F32, ("seq", 64)), (F32, (64,))], 2) == \
        [("seq", 64), ("seq", 64)]
    assert infer(ADD_RMS_NORM_OP, [(F16, (4, 1, 64)), (F16, (3, 64)), (F32, (64,))], 1)[0] == (4, 3, 64)
    with pytest.raises(InferError, match="weight has shape"):
        infer(ADD_RMS_NORM_OP, [(F32, ("seq", 64)), (F32, ("seq", 64)), (F32, (32,))], 2)
    with pytest.raises(InferError, match="do not broadcast"):
        infer(ADD_RMS_NORM_OP, [(F32, (2, 64)), (F32, (3, 64)), (F32, (64,))], 2)


@pytest.mark.parametrize("with_sum", [True, False])
def test_add_rmsnorm_validates_with_and_without_the_sum(with_sum: bool) -> None:
    outs = ("y", "s") if with_sum else ("y",)
    tensors = [Tensor("a", F32, ("seq", 64)), Tensor("b", F32, ("seq", 64)), _w("w", F32, (64,)),
               Tensor("y", F32, ("seq", 64)), Tensor("s", F32, ("seq", 64))]
    node = Node("n", ADD_RMS_NORM_OP, ("a", "b", "w"), outs, {"eps": 1e-5})
    assert validate(_graph([node], tensors[: 4 + with_sum], ["a", "b"], list(outs))) == []


@pytest.mark.parametrize("unit_offset", [False, True])
def test_add_rmsnorm_reference_equals_add_then_rmsnorm(unit_offset: bool) -> None:
    a, b = (RNG.standard_normal((3, 16)).astype(np.float32) for _ in range(2))
    w = RNG.standard_normal(16).astype(np.float32)
    attrs = {"eps": 1e-5, "add_unit_offset": unit_offset}
    y, s = run_node(Node("f", ADD_RMS_NORM_OP, ("a", "b", "w"), ("y", "s"), attrs), [a, b, w])
    (s_ref,) = run_node(Node("add", "Add", ("a", "b"), ("s",)), [a, b])
    (y_ref,) = run_node(Node("norm", "RMSNorm", ("s", "w"), ("y",), attrs), [s_ref, w])
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
