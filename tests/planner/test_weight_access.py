"""What a step stages and reads per token follows from the schema's weight access (uaii.ir.ops.WeightAccess), not
from op names or input slots: a Gather table is read by rows only along axis 0, a MatMul weight streams in row
chunks only stored [N, K], and a plugin op that declares EXPERTS or ROWS is planned like the built-ins."""

from __future__ import annotations

from planner_helpers import Builder

from uaii.ir import Graph, Registry
from uaii.ir.ops import FLOATS, INDEX_TYPES, WEIGHT_TYPES, OpSchema, Param, WeightAccess, int_attr
from uaii.ir.shapes import Shape
from uaii.planner.liveness import execution_order
from uaii.planner.storage import WeightUse, weight_uses

V, D = 64, 32
ROW = D * 4  # one f32 row


def _uses(g: Graph, registry: Registry | None = None) -> dict[str, WeightUse]:
    return {u.ref.partition("#")[2]: u for u in weight_uses(g, execution_order(g), registry).values()}


def _gather(axis: int) -> Graph:
    b = Builder()
    ids = b.input("ids", "i64", ["seq"])
    shape = ["seq", D] if axis == 0 else [V, "seq"]
    b.outputs.append(b.op("Gather", [b.weight("table", "f32", [V, D]), ids], [("y", "f32", shape)], axis=axis))
    return b.build()


def test_a_gather_along_axis_0_reads_rows_and_stages_nothing() -> None:
    [u] = _uses(_gather(0)).values()
    assert (u.staged, u.per_token, u.chunk_row) == ({0: 0}, ROW, ROW)
    [whole] = _uses(_gather(1)).values()  # along another axis every row is read: staged whole
    assert (whole.staged, whole.per_token, whole.chunk_row) == ({0: V * ROW}, V * ROW, 0)


def test_only_a_matmul_weight_stored_n_by_k_streams_in_row_chunks() -> None:
    b = Builder()
    x = b.input("x", "f32", ["seq", D])
    y = b.op("MatMulRelu", [x, b.weight("nk", "f32", [V, D])], [("y", "f32", ["seq", V])], transpose_b=True)
    b.outputs.append(b.op("MatMul", [y, b.weight("kn", "f32", [V, D])], [("z", "f32", ["seq", D])]))
    uses = _uses(b.build())
    assert uses["nk"].chunk_row == ROW and uses["kn"].chunk_row == 0
    assert uses["nk"].staged == {0: V * ROW} and uses["kn"].staged == {1: V * ROW}


def _infer_first(ctx: object) -> list[Shape | None]:
    return [ctx.shape(0)]  # type: ignore[attr-defined]


def test_a_plugin_op_is_planned_by_the_access_it_declares() -> None:
    """No op name in the planner: a custom op reading a bank by expert and a table by rows stages neither."""
    reg = Registry()
    reg.register(OpSchema(
        "vendor/Lookup", 1, "Y = X + bank[chosen experts] + table[ids] (a probe)",
        inputs=(Param("X", "T"), Param("ids", INDEX_TYPES), Param("bank", "W"), Param("table", "W")),
        outputs=(Param("Y", "T"),), attrs=(int_attr("top_k", 2, "experts per token", min=1),),
        types={"T": FLOATS, "W": WEIGHT_TYPES}, infer=_infer_first,
        weight_access={2: WeightAccess.EXPERTS, 3: WeightAccess.ROWS}))
    b = Builder()
    x, ids = b.input("x", "f32", ["seq", D]), b.input("ids", "i64", ["seq"])
    inputs = [x, ids, b.weight("bank", "f32", [8, 4, D]), b.weight("table", "f32", [V, D])]
    b.outputs.append(b.op("vendor/Lookup", inputs, [("y", "f32", ["seq", D])], top_k=3))
    uses = _uses(b.build(), reg)
    expert = 4 * ROW
    assert (uses["bank"].staged, uses["bank"].per_token) == ({0: 0}, 3 * expert)
    assert uses["bank"].expert == 4096 + 2 * 4096  # one expert, page-rounded, and its read window's slack
    assert (uses["table"].staged, uses["table"].per_token) == ({0: 0}, ROW)
