"""Fusion passes: each leaves the graph's outputs unchanged (NumPy reference, 1e-5), replaces exactly the nodes it
should, produces a graph that validates, and never mutates its input."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from planner_helpers import Builder, Dims, llama, llama_feeds, ops, random_weights

from uaii.ir import Graph, check
from uaii.ir.reference import evaluate
from uaii.planner import (
    PlannerError,
    PlannerOptions,
    available_passes,
    default_passes,
    fuse,
    fuse_add_norm,
    fuse_glu,
    fuse_grouped_matmul,
    get_pass,
    register_pass,
    run_passes,
)
from uaii.planner.passes import unregister_pass

Pass = Callable[[Graph], Graph]


def assert_same_outputs(before: Graph, after: Graph, seed: int = 0) -> None:
    """Evaluate both graphs on one set of random inputs; every graph output agrees to 1e-5."""
    weights, feeds = random_weights(before, seed), llama_feeds(before, seed=seed + 1)
    want, got = evaluate(before, feeds, weights), evaluate(after, feeds, weights)
    assert set(want) == set(got) == set(before.outputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)


def fused_and_checked(fn: Pass, graph: Graph) -> Graph:
    snapshot = dataclasses.replace(graph)
    out = fn(graph)
    assert graph == snapshot  # the input is untouched
    check(out)
    return out


# --- glu ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gelu", [False, True])
def test_glu_pass_fuses_mul_of_activation(gelu: bool) -> None:
    g = llama(2, gelu=gelu)
    f = fused_and_checked(fuse_glu, g)
    glu = "GeGLU" if gelu else "SwiGLU"
    assert ops(f).count(glu) == 2 and "Silu" not in ops(f) and "Gelu" not in ops(f)
    assert ops(f).count("Mul") == 0 and len(f.nodes) == len(g.nodes) - 2
    node = next(n for n in f.nodes if n.op == glu)
    assert node.inputs == ("blk.0.ffn_gate", "blk.0.ffn_up") and node.outputs == ("blk.0.ffn_glu",)
    assert "blk.0.ffn_act" not in f.tensor_map  # the intermediate is gone
    if gelu:
        assert node.get("approximate") == "tanh"
    assert_same_outputs(g, f)


def test_glu_pass_takes_either_operand_order() -> None:
    b = Builder()
    x, y = b.input("x", "f32", [2, 8]), b.input("y", "f32", [2, 8])
    s = b.op("Silu", [x], [("s", "f32", [2, 8])])
    b.outputs.append(b.op("Mul", [y, s], [("m", "f32", [2, 8])]))
    f = fused_and_checked(fuse_glu, b.build())
    assert [(n.op, n.inputs) for n in f.nodes] == [("SwiGLU", ("x", "y"))]


def _silu_mul(extra_reader: bool = False, output: bool = False, broadcast: bool = False) -> Graph:
    b = Builder()
    x, y = b.input("x", "f32", [2, 8]), b.input("y", "f32", [1, 8] if broadcast else [2, 8])
    s = b.op("Silu", [x], [("s", "f32", [2, 8])])
    b.outputs.append(b.op("Mul", [s, y], [("m", "f32", [2, 8])]))
    if extra_reader:
        b.outputs.append(b.op("Relu", [s], [("r", "f32", [2, 8])]))
    if output:
        b.outputs.append(s)
    return b.build()


@pytest.mark.parametrize("case", ["extra_reader", "output", "broadcast"])
def test_glu_pass_leaves_shared_or_broadcasting_activations(case: str) -> None:
    g = _silu_mul(**{case: True})
    assert fuse_glu(g) is g


# --- add + rmsnorm --------------------------------------------------------------------------------------------
def test_add_rmsnorm_pass_fuses_every_residual_add_with_its_norm() -> None:
    g = llama(2)
    f = fused_and_checked(fuse_add_norm, g)
    fused = [n for n in f.nodes if n.op == "AddRMSNorm"]
    # ffn_norm of each layer, attn_norm of layer 1 and the final norm: 4; the first attn_norm reads the embedding
    assert len(fused) == 4 and ops(f).count("RMSNorm") == 1 and ops(f).count("Add") == 0
    first = fused[0]
    assert first.inputs == ("embd", "blk.0.attn_out", "blk.0.ffn_norm.weight")
    assert first.outputs == ("blk.0.ffn_norm", "blk.0.attn_residual")  # the sum continues the residual stream
    assert first.get("eps") == pytest.approx(1e-5)
    last = fused[-1]
    assert last.outputs == ("output_norm",)  # the last sum has no other reader: omitted
    assert "blk.1.ffn_residual" not in f.tensor_map
    assert_same_outputs(g, f)


def test_add_rmsnorm_pass_needs_the_norm_weight_before_the_add() -> None:
    b = Builder()
    x, y = b.input("x", "f32", [2, 8]), b.input("y", "f32", [2, 8])
    s = b.op("Add", [x, y], [("s", "f32", [2, 8])])
    w = b.op("Relu", [b.input("w0", "f32", [8])], [("w", "f32", [8])])  # a computed weight, after the Add
    b.outputs.append(b.op("RMSNorm", [s, w], [("n", "f32", [2, 8])]))
    g = b.build()
    assert fuse_add_norm(g) is g


# --- grouped matmul -------------------------------------------------------------------------------------------
def test_grouped_matmul_pass_groups_qkv_and_gate_up() -> None:
    g = llama(2)
    f = fused_and_checked(fuse_grouped_matmul, g)
    grouped = [n for n in f.nodes if n.op == "GroupedMatMul"]
    assert len(grouped) == 4
    qkv, gate_up = grouped[0], grouped[1]
    assert qkv.inputs == ("blk.0.attn_norm", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight")
    assert qkv.outputs == ("blk.0.q", "blk.0.k", "blk.0.v") and qkv.get("transpose_b") is True
    assert gate_up.outputs == ("blk.0.ffn_gate", "blk.0.ffn_up")
    assert ops(f).count("MatMul") == 2 * 2 + 1  # attn_output and ffn_down per layer, lm_head
    assert_same_outputs(g, f)


def test_grouped_matmul_pass_keeps_weight_dtypes_apart() -> None:
    b = Builder()
    x = b.input("x", "f32", ["seq", 256])
    for name, dt in (("q", "q4_k"), ("k", "q4_k"), ("v", "q6_k")):
        w = b.weight(f"w{name}", dt, [256, 256])
        b.outputs.append(b.op("MatMul", [x, w], [(name, "f32", ["seq", 256])], transpose_b=True))
    f = fused_and_checked(fuse_grouped_matmul, b.build())
    assert [(n.op, n.outputs) for n in f.nodes] == [("GroupedMatMul", ("q", "k")), ("MatMul", ("v",))]


def test_grouped_matmul_pass_needs_transposed_weights() -> None:
    b = Builder()
    x = b.input("x", "f32", [2, 8])
    for name in ("a", "c"):
        b.outputs.append(b.op("MatMul", [x, b.weight(f"w{name}", "f32", [8, 4])], [(name, "f32", [2, 4])]))
    g = b.build()
    assert fuse_grouped_matmul(g) is g


# --- all passes together, the registry ------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [False, True])
def test_all_passes_compose_and_keep_outputs(tied: bool) -> None:
    g = llama(3, tied=tied, dims=Dims(d=24, ff=40))
    f = fused_and_checked(lambda x: fuse(x, PlannerOptions()), g)
    assert ops(f).count("GroupedMatMul") == 6 and ops(f).count("SwiGLU") == 3 and ops(f).count("AddRMSNorm") == 6
    assert_same_outputs(g, f, seed=3)
    assert fuse(f) == f  # fixed point: nothing left to fuse


def test_loader_style_graph_keeps_its_swiglu() -> None:
    g = llama(1, glu="fused")
    f = fuse(g)
    assert ops(f).count("SwiGLU") == 1
    assert_same_outputs(g, f)


def test_pass_registry_names_order_and_options() -> None:
    assert available_passes()[:3] == ("glu", "add_rms_norm", "grouped_matmul")
    assert set(default_passes()) >= {"glu", "add_rms_norm", "grouped_matmul"}
    assert get_pass("glu").doc.startswith("Mul(Silu(a), b)")
    g = llama(1)
    assert fuse(g, PlannerOptions(enable_fusion=False)) is g
    only_glu = fuse(g, PlannerOptions(passes=("glu",)))
    assert "SwiGLU" in ops(only_glu) and "GroupedMatMul" not in ops(only_glu) and "AddRMSNorm" not in ops(only_glu)
    assert fuse(g, PlannerOptions(passes=())) is g
    with pytest.raises(PlannerError, match=r"unknown fusion pass 'nope'; registered passes: glu, "):
        run_passes(g, ["glu", "nope"])


def test_a_registered_pass_runs_by_name() -> None:
    calls: list[str] = []

    def count(graph: Graph, registry: object = None) -> Graph:
        """Counts the graphs it sees."""
        calls.append(graph.name)
        return graph

    register_pass("count_graphs", count, default=False)
    try:
        with pytest.raises(PlannerError, match="already registered"):
            register_pass("count_graphs", count)
        assert "count_graphs" in available_passes() and "count_graphs" not in default_passes()
        assert get_pass("count_graphs").doc == "Counts the graphs it sees."
        fuse(llama(1), PlannerOptions(passes=("count_graphs", "glu")))
        assert calls == ["llama"]
    finally:
        unregister_pass("count_graphs")
