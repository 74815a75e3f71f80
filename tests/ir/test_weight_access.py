"""How an op reads a weight is a property of its schema (uaii.ir.ops.access), read by planner, backends and runtime:
every built-in input that can hold a packed weight declares it, declarations resolve per node, and a schema with a
declaration that cannot hold is refused when it is made."""

from __future__ import annotations

import pytest

from uaii.ir import Node, UaiiError, WeightAccess, get_schema, render_markdown
from uaii.ir.dtype import QUANTIZED_TYPES
from uaii.ir.ops import BUILTIN_SCHEMAS, FUSED_SCHEMAS, AccessIf, OpSchema, Param, WeightInput, int_attr
from uaii.ir.ops.schema import WEIGHT_TYPES

ROWS, WHOLE, EXPERTS, CHUNKS = (WeightAccess.ROWS, WeightAccess.WHOLE, WeightAccess.EXPERTS,
                                WeightAccess.ROW_CHUNKS)


@pytest.mark.parametrize("schema", [*BUILTIN_SCHEMAS, *FUSED_SCHEMAS], ids=lambda s: s.op)
def test_every_input_that_can_hold_a_packed_weight_declares_how_it_is_read(schema: OpSchema) -> None:
    """A block-quantized weight reaches an op only through an input whose types admit it; that op must say whether
    it reads the weight whole, by rows, by expert or in row chunks (a new op cannot forget it)."""
    declared = dict(schema.weight_access)
    for slot, p in enumerate(schema.inputs):
        if schema.allowed(p) & QUANTIZED_TYPES:
            assert slot in declared, f"{schema.op} input #{slot} ({p.name}) takes packed weights but declares no access"


@pytest.mark.parametrize(("op", "slot", "attrs", "want"), [
    ("MatMul", 1, {"transpose_b": True}, CHUNKS),  # [N, K]: one output feature per row
    ("MatMul", 1, {"transpose_b": False}, WHOLE),  # [K, N]: a row is an input feature
    ("MatMulRelu", 1, {"transpose_b": True}, CHUNKS),
    ("Gemm", 1, {"transB": True}, WHOLE),
    ("Embedding", 1, {}, ROWS),
    ("Gather", 0, {"axis": 0}, ROWS),
    ("Gather", 0, {"axis": 1}, WHOLE),
    ("MoEExperts", 3, {}, EXPERTS), ("MoEExperts", 4, {}, EXPERTS), ("MoEExperts", 5, {}, EXPERTS),
    ("MoEExpertsSwiGLU", 5, {}, EXPERTS),
    ("GroupedMatMul", 4, {"transpose_b": True}, WHOLE),  # the variadic slot's declaration covers every weight
    ("RMSNorm", 1, {}, WHOLE),  # undeclared: whole
    ("MoEExperts", 0, {}, WHOLE),
])
def test_declared_access_per_slot_and_attributes(op: str, slot: int, attrs: dict[str, object],
                                                 want: WeightAccess) -> None:
    assert get_schema(op).access(slot, attrs) is want  # type: ignore[arg-type]


def test_weight_inputs_names_the_weights_of_a_node_with_their_access() -> None:
    node = Node("blk.0/moe", "MoEExperts", ("x", "rw", "ri", "gate", "up", "down"), ("y",),
                {"n_experts": 8, "top_k": 2})
    schema = get_schema("MoEExperts")
    assert schema.weight_inputs(node, {"gate", "up", "down", "unrelated"}) == [
        WeightInput(3, "gate", EXPERTS), WeightInput(4, "up", EXPERTS), WeightInput(5, "down", EXPERTS)]
    assert schema.weight_inputs(node, set()) == []
    mm = Node("head", "MatMul", ("h", "w"), ("logits",), {"transpose_b": True})
    assert get_schema("MatMul").weight_inputs(mm, {"w"}) == [WeightInput(1, "w", CHUNKS)]
    plain = Node("proj", "MatMul", ("h", "w"), ("y",))  # the default transpose_b=False is resolved
    assert get_schema("MatMul").weight_inputs(plain, {"w"}) == [WeightInput(1, "w", WHOLE)]
    gather = Node("g", "Gather", ("table", "ids"), ("y",), {"axis": -1})
    assert get_schema("Gather").weight_inputs(gather, {"table"}, {"axis": -1}) == [WeightInput(0, "table", WHOLE)]


def test_weight_inputs_filters_by_access() -> None:
    node = Node("blk.0/moe", "MoEExperts", ("x", "rw", "ri", "gate", "up", "down"), ("y",),
                {"n_experts": 8, "top_k": 2})
    schema = get_schema("MoEExperts")
    assert schema.weight_inputs(node, {"x", "gate", "down"}, access=EXPERTS) == [
        WeightInput(3, "gate", EXPERTS), WeightInput(5, "down", EXPERTS)]
    assert schema.weight_inputs(node, {"x", "gate"}, access=WHOLE) == [WeightInput(0, "x", WHOLE)]
    assert schema.weight_inputs(node, {"gate"}, access=CHUNKS) == []


def _schema(**kw: object) -> OpSchema:
    base: dict[str, object] = {
        "inputs": (Param("X", "T"), Param("W", "W")), "outputs": (Param("Y", "T"),),
        "types": {"T": frozenset(WEIGHT_TYPES - QUANTIZED_TYPES), "W": WEIGHT_TYPES}}
    return OpSchema("Probe", 1, "probe", **{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "said"), [
    ({"weight_access": {2: WHOLE}}, "input slot 2, which the schema does not have"),
    ({"weight_access": {1: AccessIf("transpose_b", True, CHUNKS)}}, "depends on attribute 'transpose_b'"),
    ({"weight_access": {1: EXPERTS}}, "needs an int attribute 'top_k'"),
    ({"weight_access": {1: "rows"}}, "expected a WeightAccess or an AccessIf"),
])
def test_a_declaration_that_cannot_hold_is_refused_when_the_schema_is_made(kw: dict[str, object], said: str) -> None:
    with pytest.raises(UaiiError, match=r"\[registry\] schema 'Probe' v1: ") as e:
        _schema(**kw)
    assert said in str(e.value)


def test_a_valid_declaration_is_data_that_compares_and_hashes() -> None:
    a = _schema(weight_access={1: EXPERTS}, attrs=(int_attr("top_k", None, "k", required=True),))
    b = _schema(weight_access=((1, EXPERTS),), attrs=(int_attr("top_k", None, "k", required=True),))
    assert a == b and hash(a) == hash(b) and a.access(1) is EXPERTS


def test_the_op_reference_lists_weight_access() -> None:
    text = render_markdown(builtin_only=True)
    assert "**Weight access** (a weight in any other input is read whole): B: row_chunks if transpose_b = True, " \
           "else whole" in text
    assert "gate_exps: experts; up_exps: experts; down_exps: experts" in text
