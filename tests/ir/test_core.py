"""Core IR types: dtypes, weight references, immutable graphs, the plan representation."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from uaii.ir import (
    DType,
    Graph,
    GraphError,
    Node,
    Tensor,
    UaiiError,
    WeightRef,
    WeightRefError,
    attr,
    tensor_nbytes,
)
from uaii.ir.errors import FormatError
from uaii.ir.graph import AttrType
from uaii.ir.plan import ArenaLayout, BufferSlot, ExecutionPlan, Step, StoragePlan, WeightPlacement

# ggml.h / gguf-py GGML_QUANT_SIZES, written out so that this test needs no gguf package (isolation check).
GGML_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
    16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82),
    23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17),
}


@pytest.mark.parametrize("type_id", sorted(GGML_SIZES))
def test_dtype_layout_matches_ggml(type_id: int) -> None:
    d = DType.from_gguf_id(type_id)
    assert (d.block_size, d.type_size) == GGML_SIZES[type_id]
    assert d.gguf_id == type_id


def test_dtype_layout_matches_gguf_package_when_present() -> None:
    gguf = pytest.importorskip("gguf")
    for t, (bs, ts) in gguf.constants.GGML_QUANT_SIZES.items():
        if t.name == "Q8_1":
            continue  # gguf-py lists 40 bytes; ggml.c's sizeof(block_q8_1) is 36 (ours). Never stored in files.
        d = DType.from_gguf_id(int(t))
        assert (d.block_size, d.type_size) == (bs, ts), t


def test_dtype_parse_and_errors() -> None:
    assert DType.parse("Q4_K") is DType.Q4_K
    assert DType.parse("float16") is DType.F16
    assert DType.from_numpy(np.int64) is DType.I64
    with pytest.raises(UaiiError, match="unknown dtype"):
        DType.parse("q9_9")
    with pytest.raises(UaiiError, match="GGUF tensor type id 4"):
        DType.from_gguf_id(4)  # removed from ggml (Q4_2)
    with pytest.raises(UaiiError, match="block-quantized"):
        _ = DType.Q4_0.numpy


def test_tensor_nbytes() -> None:
    assert tensor_nbytes(DType.Q4_0, (576, 1536)) == 576 * 1536 // 32 * 18
    assert tensor_nbytes(DType.F16, (3, 5)) == 30
    with pytest.raises(UaiiError, match="multiple of 256"):
        tensor_nbytes(DType.Q4_K, (2, 100))
    with pytest.raises(UaiiError, match="symbolic"):
        tensor_nbytes(DType.F32, ("seq", 4))


# --- weight references -------------------------------------------------------------------------------------
_seg = st.text(st.characters(blacklist_characters="#\x00", blacklist_categories=("Cs",)), min_size=1, max_size=20)


@given(path=_seg, tensor=st.none() | _seg, expert=st.none() | st.integers(0, 10**6))
def test_weightref_roundtrip(path: str, tensor: str | None, expert: int | None) -> None:
    if tensor is None:
        expert = None
    ref = WeightRef(path, tensor, expert)
    assert WeightRef.parse(str(ref)) == ref


@pytest.mark.parametrize("text,expected", [
    ("model.gguf#blk.0.attn_q.weight", WeightRef("model.gguf", "blk.0.attn_q.weight")),
    ("m.gguf#blk.1.ffn_up_exps.weight#e=7", WeightRef("m.gguf", "blk.1.ffn_up_exps.weight", 7)),
    ("weights/w1.bin", WeightRef("weights/w1.bin")),
])
def test_weightref_parse(text: str, expected: WeightRef) -> None:
    assert WeightRef.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize("bad", ["", "#t", "m.gguf#", "m.gguf#t#e=x", "m.gguf#t#e=-1", "m.gguf#t#e=01"])
def test_weightref_malformed(bad: str) -> None:
    with pytest.raises(WeightRefError):
        WeightRef.parse(bad)


def test_weightref_resolve_and_sandbox(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "weights").mkdir(parents=True)
    (root / "weights" / "w.bin").write_bytes(b"\0" * 4)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"x")
    os.symlink(outside, root / "weights" / "link.bin")

    assert WeightRef("weights/w.bin").resolve(root) == root / "weights" / "w.bin"
    assert WeightRef("weights/w.bin").resolve(root, sandbox=root) == (root / "weights" / "w.bin").resolve()
    with pytest.raises(WeightRefError, match=r"'\.\.'"):
        WeightRef("../secret.bin").resolve(root, sandbox=root)
    with pytest.raises(WeightRefError, match="absolute"):
        WeightRef(str(outside)).resolve(root, sandbox=root)
    with pytest.raises(WeightRefError, match="outside the sandbox"):
        WeightRef("weights/link.bin").resolve(root, sandbox=root)
    # Without a sandbox, relative references resolve against the model directory and '..' is allowed.
    assert WeightRef("../secret.bin").resolve(root) == outside


# --- graph objects -----------------------------------------------------------------------------------------
def test_graph_is_immutable_and_attributes_are_typed() -> None:
    n = Node("fc", "MatMul", ("x", "w"), ("y",), {"transpose_b": True, "alpha": 1.0, "perm": [1, 0]})
    assert n.get("transpose_b") is True
    assert n.attrs["alpha"].type is AttrType.FLOAT
    assert n.attrs["perm"].value == (1, 0)
    with pytest.raises(AttributeError):
        n.name = "other"  # type: ignore[misc]
    g = Graph("g", ("x",), ("y",), (n,), (Tensor("x", DType.F32, (1, 4)),), {"b": "2", "a": "1"})
    assert g.metadata == (("a", "1"), ("b", "2"))
    assert g.tensor("x").shape == (1, 4)
    with pytest.raises(GraphError):
        g.tensor("nope")


def test_attr_inference() -> None:
    assert attr(3).type is AttrType.INT and attr(True).type is AttrType.BOOL
    assert attr([1.0, 2]).type is AttrType.FLOAT_ARRAY
    assert attr(np.float32(0.5)).value == 0.5
    with pytest.raises(GraphError):
        attr({"a": 1})
    with pytest.raises(GraphError, match="64 bits"):
        attr(1 << 63)


def test_tensor_constant_and_checks() -> None:
    c = Tensor.constant("shape", np.array([2, -1], dtype=np.int64))
    assert c.dtype is DType.I64 and c.is_constant
    np.testing.assert_array_equal(c.numpy(), [2, -1])
    with pytest.raises(GraphError, match="needs 16"):
        Tensor("c", DType.I64, (2,), data=b"\0" * 8)
    with pytest.raises(GraphError, match="identifier"):
        Tensor("t", DType.F32, ("not a name",))
    with pytest.raises(GraphError, match=">= 0"):
        Tensor("t", DType.F32, (-1,))
    w = Tensor("w", DType.Q4_K, (256, 256), weight=WeightRef("m.gguf", "w"))
    assert w.is_weight


# --- plans -------------------------------------------------------------------------------------------------
def _plan() -> ExecutionPlan:
    return ExecutionPlan(
        key="ab" * 32, graph_name="llama",
        steps=(Step("MatMul/1/q4_k", "blk.0.q", ("x", "m.gguf#blk.0.attn_q.weight"), ("q",),
                    attributes=(("transpose_b", True), ("dims", (1, 2))), op="MatMul", version=1),),
        arena=ArenaLayout(4096, 64, 16, (BufferSlot("x", 0, 2048, "f32", 0, 1),
                                         BufferSlot("q", 2048, 2048, "f32", 0, 3))),
        storage=StoragePlan(1 << 20, (WeightPlacement("m.gguf#blk.0.attn_q.weight", 1000, "blk.0", "streamed"),
                                      WeightPlacement("m.gguf#token_embd.weight", 5000, "embed", "pinned")),
                            (65536, 65536), ("m.gguf#blk.0.attn_q.weight",)),
        metadata=(("planner", "test"),))


def test_plan_roundtrip_is_canonical() -> None:
    p = _plan()
    text = p.to_json()
    back = ExecutionPlan.from_json(text)
    assert back == p
    assert back.to_json() == text
    assert p.storage.pinned_bytes == 5000 and p.storage.streamed_bytes == 1000
    assert p.storage.staging_bytes == 131072


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format_version": 1}', '{"format_version": 99}'])
def test_plan_corrupt_raises_format_error(text: str) -> None:
    with pytest.raises(FormatError, match=r"\[plan\]"):
        ExecutionPlan.from_json(text, path="cache/plan.json")


_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
_ATTRS = st.lists(st.tuples(_NAMES, st.one_of(st.integers(-2**40, 2**40), st.booleans(), _NAMES,
                                               st.lists(st.integers(0, 9), max_size=3).map(tuple))),
                  max_size=3, unique_by=lambda kv: kv[0]).map(tuple)


@given(steps=st.lists(st.builds(lambda op, version, node, ins, outs, attrs: Step(
    f"{op}/{version}/f32", node, ins, outs, attributes=attrs, op=op, version=version),
    _NAMES, st.integers(1, 1 << 31), _NAMES, st.lists(_NAMES, max_size=3).map(tuple),
    st.lists(_NAMES, min_size=1, max_size=2).map(tuple), _ATTRS), max_size=4))
def test_plan_steps_keep_op_and_version_through_json(steps: list[Step]) -> None:
    """Op names may hold '/' (a plugin's vendor/Op): they travel as their own field, never parsed from kernel."""
    p = ExecutionPlan(key="cd" * 32, graph_name="g", steps=tuple(steps), arena=ArenaLayout(0, 64, 1))
    text = p.to_json()
    back = ExecutionPlan.from_json(text)
    assert back == p and back.to_json() == text
    assert [(s.op, s.version) for s in back.steps] == [(s.op, s.version) for s in steps]


def test_a_format_1_plan_or_a_step_without_op_is_a_format_error() -> None:
    """Plan format 2 added Step.op/version; a format-1 plan (a cache entry written before) does not load."""
    d = _plan().to_dict()
    for s in d["steps"]:
        del s["op"], s["version"]
    with pytest.raises(FormatError, match="format version 1, expected 2"):
        ExecutionPlan.from_json(_json({**d, "format_version": 1}))
    with pytest.raises(FormatError, match="KeyError: 'op'"):
        ExecutionPlan.from_json(_json(d))
    bad = _plan().to_dict()
    bad["steps"][0]["version"] = 0
    with pytest.raises(FormatError, match="version 0; expected an int >= 1"):
        ExecutionPlan.from_json(_json(bad))
    with pytest.raises(TypeError, match="op"):
        Step("MatMul/1/f32", "n", (), ())  # type: ignore[call-arg]


def test_a_plan_arena_without_its_rule_is_a_format_error() -> None:
    """Format 2 always writes the arena's rule; an entry without one is damaged, not a plan of the generic rule (a
    backend's arena read as the planner's would be checked against the wrong rule)."""
    d = _plan().to_dict()
    del d["arena"]["rule"]
    with pytest.raises(FormatError, match="KeyError: 'rule'"):
        ExecutionPlan.from_json(_json(d))


def test_planned_bytes_sums_what_the_plan_holds() -> None:
    p = _plan()
    p = replace(p, storage=replace(p.storage, kv_cache_bytes=300, expert_cache_bytes=20))
    assert p.planned_bytes == 5000 + 131072 + 300 + 20 + 4096


def _json(d: object) -> str:
    return json.dumps(d)


def test_topological_order_is_stable_and_leaves_cycles_out() -> None:
    from uaii.ir.graph import topological_order

    assert topological_order({0: set(), 1: set(), 2: {0}, 3: {1, 2}}) == [0, 1, 2, 3]
    assert topological_order({0: {3}, 1: set(), 2: {1}, 3: set()}) == [1, 2, 3, 0]  # ties by the smaller key
    assert topological_order({5: {9}, 7: {5}}) == [5, 7]  # a dependency outside the keys is ignored
    assert topological_order({0: set(), 1: {2}, 2: {1}, 3: {1}}) == [0]  # on or behind the 1<->2 cycle: left out
