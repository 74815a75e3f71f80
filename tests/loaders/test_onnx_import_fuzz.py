"""Fuzzing the ONNX importer: random small graphs of the ops it translates, with hostile attributes and constants.

The file layer has its own fuzzing (test_onnx_fuzz.py: corrupt bytes). Here the files are well formed and the
*graphs* are hostile: sizes of 2^40 for Range / ConstantOfShape / Expand / Reshape, negative and INT64 extreme
dims, axes out of range, inputs of the wrong rank or type, ops fed each other's results in any order. Loading such
a model (reader, importer, IR validation) must end in a sound graph or a LoaderError / FormatError — never another
exception (a numpy or Python error, an invalid IR graph) — and with bounded work: tracemalloc's peak while it
loads stays under a few MiB (nothing large is computed at load time; big constant results stay run-time nodes).

100 cases run by default (~10 s); the slow test runs UAII_ONNX_IMPORT_FUZZ_CASES (default 1000, ~100 s).
"""

from __future__ import annotations

import os
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from uaii.ir import FormatError  # noqa: E402
from uaii.loaders import LoaderError, load_model  # noqa: E402

CASES = int(os.environ.get("UAII_ONNX_IMPORT_FUZZ_CASES", "1000"))
PEAK_BYTES = 32 << 20
HOSTILE = [-(1 << 63), -(1 << 40), -(1 << 31), -5, -2, -1, 0, 1, 2, 3, 4, 7, 1 << 15, 1 << 20, (1 << 31) - 1, 1 << 31,
           1 << 40, 1 << 62, (1 << 63) - 1]
SMALL = [-3, -2, -1, 0, 1, 2, 3, 5]
SIZES = [0, 1, 2, 3, 7, 1 << 10, 1 << 15, 1 << 20, 1 << 28, 1 << 31, 1 << 40]
"""Non-negative sizes, small to absurd: what makes a constant result huge rather than refused."""
ELEMS = [TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.INT64, TP.INT32, TP.BOOL, TP.INT8, TP.DOUBLE, TP.UINT8]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "Pow", "Mod", "And", "MatMul"]
UNARY = ["Relu", "Neg", "Abs", "Floor", "Ceil", "IsInf", "IsNaN", "Not", "Sqrt", "Size", "Identity", "Softmax"]


class _Graph:
    """A graph under construction: the values made so far (any of which a later node may consume), and which of
    them are int64 size vectors / scalars (so that most draws are well typed and the import gets deep)."""

    def __init__(self) -> None:
        self.nodes: list[Any] = [helper.make_node("Shape", ["x"], ["v0"]), helper.make_node("Shape", ["ids"], ["v1"])]
        self.values = ["x", "ids", "v0", "v1"]
        self.vectors = ["v0", "v1"]
        self.scalars: list[str] = []

    def new(self, kind: str = "") -> str:
        name = f"v{len(self.values)}"
        self.values.append(name)
        if kind == "vector":
            self.vectors.append(name)
        elif kind == "scalar":
            self.scalars.append(name)
        return name

    def const(self, array: np.ndarray) -> str:
        name = self.new("vector" if array.ndim == 1 and array.dtype == np.int64 else
                        "scalar" if array.ndim == 0 and array.dtype == np.int64 else "")
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array)))
        return name


def _ints(draw: Any, n_max: int = 4, pool: list[int] = HOSTILE) -> np.ndarray:
    return np.asarray(draw(st.lists(st.sampled_from(pool), min_size=0, max_size=n_max)), np.int64)


def _operand(draw: Any, g: _Graph, want: str = "any") -> str:
    """Mostly what ``want`` asks for ("vector": an int64 size vector, "scalar": an int64 scalar), sometimes
    anything: a value already in the graph, or a new hostile constant."""
    if want != "any" and draw(st.integers(0, 3)):
        pool = g.vectors if want == "vector" else g.scalars
        if pool and draw(st.booleans()):
            return str(draw(st.sampled_from(pool)))
        pool_ints = draw(st.sampled_from([SIZES, HOSTILE]))
        if want == "vector":
            return g.const(_ints(draw, 4, pool_ints))
        return g.const(np.asarray(draw(st.sampled_from(pool_ints)), np.int64))
    kind = draw(st.sampled_from(["value", "value", "ints", "scalar", "float"]))
    if kind == "value":
        return str(draw(st.sampled_from(g.values)))
    if kind == "ints":
        return g.const(_ints(draw))
    if kind == "scalar":
        return g.const(np.asarray(draw(st.sampled_from(HOSTILE)), np.int64))
    return g.const(np.asarray(draw(st.sampled_from([0.0, -1.5, 1e30, float("inf"), 2.0])), np.float32))


def _step(draw: Any, g: _Graph) -> None:
    op = draw(st.sampled_from(["Range", "ConstantOfShape", "Expand", "Reshape", "Slice", "Gather", "Concat", "Split",
                               "Squeeze", "Unsqueeze", "Transpose", "Cast", "binary", "unary", "Where", "CumSum",
                               "Trilu", "ReduceSum", "Flatten", "Shape", "Gemm", "GatherND", "size", "Range", "Expand",
                               "size", "size", "pick", "ConstantOfShape", "Tile"]))
    a = _operand(draw, g)
    if op == "Range":
        delta = g.const(np.asarray(draw(st.sampled_from([1, 1, 2, -1, 0, 3, -(1 << 63)])), np.int64))
        ins = [_operand(draw, g, "scalar"), _operand(draw, g, "scalar"), delta if draw(st.booleans()) else
               _operand(draw, g, "scalar")]
        g.nodes.append(helper.make_node("Range", ins, [g.new()]))
    elif op == "ConstantOfShape":
        elem = draw(st.sampled_from(ELEMS[:7]))
        value = helper.make_tensor("value", elem, [1], [draw(st.sampled_from([0, 1, -1, 7]))])
        g.nodes.append(helper.make_node("ConstantOfShape", [_operand(draw, g, "vector")], [g.new()], value=value))
    elif op in ("Expand", "Reshape", "Tile"):
        g.nodes.append(helper.make_node(op, [a, _operand(draw, g, "vector")], [g.new()]))
    elif op == "size":  # arithmetic on sizes, as exporters write it
        fn = draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min", "Concat", "Equal"]))
        want = draw(st.sampled_from(["vector", "scalar"]))
        x, y = _operand(draw, g, want), _operand(draw, g, draw(st.sampled_from(["vector", "scalar"])))
        kind = "" if fn == "Equal" else want
        g.nodes.append(helper.make_node(fn, [x, y], [g.new(kind)], **({"axis": 0} if fn == "Concat" else {})))
    elif op == "pick":  # one size out of a vector
        g.nodes.append(helper.make_node("Gather", [_operand(draw, g, "vector"), g.const(
            np.asarray(draw(st.sampled_from(SMALL)), np.int64))], [g.new("scalar")]))
    elif op == "Slice":
        n = draw(st.integers(1, 2))
        ins = [a, g.const(_ints(draw, n, HOSTILE)[:n] if draw(st.booleans()) else np.asarray([0] * n, np.int64)),
               _operand(draw, g, "vector")]
        if draw(st.booleans()):
            ins += [g.const(np.asarray(draw(st.lists(st.sampled_from(SMALL), min_size=n, max_size=n)), np.int64)),
                    g.const(np.asarray(draw(st.lists(st.sampled_from([-2, -1, 1, 2, 0]), min_size=n, max_size=n)),
                                       np.int64))]
        g.nodes.append(helper.make_node("Slice", ins, [g.new()]))
    elif op == "Gather":
        g.nodes.append(helper.make_node("Gather", [a, _operand(draw, g)], [g.new()],
                                        axis=draw(st.sampled_from(SMALL))))
    elif op == "GatherND":
        g.nodes.append(helper.make_node("GatherND", [a, _operand(draw, g)], [g.new()],
                                        batch_dims=draw(st.sampled_from([0, 1, 2]))))
    elif op == "Concat":
        g.nodes.append(helper.make_node("Concat", [a, _operand(draw, g)], [g.new()],
                                        axis=draw(st.sampled_from(SMALL))))
    elif op == "Split":
        outs = [g.new() for _ in range(draw(st.integers(1, 3)))]
        if draw(st.booleans()):
            g.nodes.append(helper.make_node("Split", [a, g.const(_ints(draw, 3))], outs,
                                            axis=draw(st.sampled_from(SMALL))))
        else:
            g.nodes.append(helper.make_node("Split", [a], outs, axis=draw(st.sampled_from(SMALL)),
                                            num_outputs=len(outs)))
    elif op in ("Squeeze", "Unsqueeze"):
        ins = [a] if op == "Squeeze" and draw(st.booleans()) else [a, g.const(_ints(draw, 3, SMALL))]
        g.nodes.append(helper.make_node(op, ins, [g.new()]))
    elif op == "Transpose":
        perm = draw(st.lists(st.sampled_from(SMALL), min_size=0, max_size=3))
        g.nodes.append(helper.make_node("Transpose", [a], [g.new()], **({"perm": perm} if perm else {})))
    elif op == "Cast":
        g.nodes.append(helper.make_node("Cast", [a], [g.new()], to=draw(st.sampled_from(ELEMS))))
    elif op == "binary":
        g.nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, _operand(draw, g)], [g.new()]))
    elif op == "unary":
        g.nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [a], [g.new()]))
    elif op == "Where":
        g.nodes.append(helper.make_node("Where", [a, _operand(draw, g), _operand(draw, g)], [g.new()]))
    elif op == "CumSum":
        g.nodes.append(helper.make_node("CumSum", [a, _operand(draw, g, "scalar")], [g.new()]))
    elif op == "Trilu":
        g.nodes.append(helper.make_node("Trilu", [a, _operand(draw, g, "scalar")], [g.new()],
                                        upper=draw(st.sampled_from([0, 1]))))
    elif op == "ReduceSum":
        g.nodes.append(helper.make_node("ReduceSum", [a, g.const(_ints(draw, 2, SMALL))], [g.new()],
                                        keepdims=draw(st.sampled_from([0, 1]))))
    elif op == "Flatten":
        g.nodes.append(helper.make_node("Flatten", [a], [g.new()], axis=draw(st.sampled_from(SMALL))))
    elif op == "Shape":
        g.nodes.append(helper.make_node("Shape", [a], [g.new("vector")], start=draw(st.sampled_from(HOSTILE)),
                                        end=draw(st.sampled_from(HOSTILE))))
    elif op == "Gemm":
        g.nodes.append(helper.make_node("Gemm", [a, _operand(draw, g)], [g.new()],
                                        transA=draw(st.sampled_from([0, 1])), alpha=0.5))


@st.composite
def hostile_models(draw: Any) -> bytes:
    g = _Graph()
    for _ in range(draw(st.integers(1, 8))):
        _step(draw, g)
    made = [v for v in g.values[4:] if not any(v == o for n in g.nodes if n.op_type == "Constant" for o in n.output)]
    outputs = (made or g.values[2:])[-draw(st.integers(1, 2)):]
    graph = helper.make_graph(
        g.nodes, "hostile",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4]), helper.make_tensor_value_info("ids", TP.INT64, ["s"])],
        [helper.make_empty_tensor_value_info(o) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def model_path() -> Any:
    with tempfile.TemporaryDirectory(prefix="uaii-import-fuzz-") as d:
        yield Path(d) / "model.onnx"


def _load(model_path: Path, data: bytes) -> None:
    model_path.write_bytes(data)
    tracemalloc.start()
    try:
        load_model(model_path)
    except (LoaderError, FormatError):
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"loading allocated {peak} bytes at its peak"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=hostile_models())
def test_hostile_graphs_import_or_fail_cleanly_with_bounded_work(model_path: Path, data: bytes) -> None:
    _load(model_path, data)


@pytest.mark.slow
@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=hostile_models())
def test_many_hostile_graphs(model_path: Path, data: bytes) -> None:
    _load(model_path, data)
