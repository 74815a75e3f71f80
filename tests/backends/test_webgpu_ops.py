"""WebGPU lowerings of the element-wise, norm, GLU, reduction and movement ops, beyond the conformance suite:
f16/bf16 rounding inside a chain of ops, narrow integers, high-rank broadcasting, dispatches that spill into the y
dimension of the grid, quantized byte copies that share words, and weights split into row shards."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from uaii.backends.analysis import node_infos
from uaii.backends.base import ArrayWeights, BackendError
from uaii.backends.testing import Case, run_case
from uaii.backends.testing.cases import Builder
from uaii.ir import DType, Graph, Node, Tensor, attr, check, make_graph
from uaii.ir.reference import evaluate, f32_to_bf16
from uaii.kernels import quantize

wgpu = pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend  # noqa: E402
from uaii.backends.webgpu.device import MAX_BINDING_ENV, GpuDevice, choose  # noqa: E402
from uaii.backends.webgpu.executable import WebGpuExecutable  # noqa: E402
from uaii.backends.webgpu.ops import LOWERINGS  # noqa: E402

GPU = WebGpuBackend(allow_software=True)
STATUS = GPU.probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")
_ids = itertools.count()


class OnDevice:
    """A backend over one given device (fresh, with forced limits), for run_case."""

    name = "webgpu"

    def __init__(self, dev: GpuDevice) -> None:
        self.dev = dev

    def supports_op(self, node: Node) -> bool:
        return node.op in LOWERINGS

    def compile(self, graph: Graph, plan: Any, weights: Any, kv_state: bool = False, **_: Any) -> WebGpuExecutable:
        return WebGpuExecutable(graph, node_infos(graph), weights, self.dev, lowerings=LOWERINGS, kv_state=kv_state)


def fresh_device(monkeypatch: pytest.MonkeyPatch, max_binding: int | None = None,
                 max_workgroups: int | None = None) -> GpuDevice:
    if max_binding is not None:
        monkeypatch.setenv(MAX_BINDING_ENV, str(max_binding))
    info, adapter = choose(True)
    dev = GpuDevice(info, adapter)
    if max_workgroups is not None:
        dev.max_workgroups = max_workgroups
    return dev


def node(op: str, ins: Sequence[str], outs: Sequence[str], **attrs: Any) -> Node:
    return Node(f"n{next(_ids)}/{op}", op, tuple(ins), tuple(outs), tuple((k, attr(v)) for k, v in attrs.items()))


def graph(nodes: Sequence[Node], values: dict[str, tuple[str, tuple[int, ...]]], inputs: Sequence[str],
          outputs: Sequence[str], weights: Sequence[str] = ()) -> Graph:
    tensors = [Tensor(n, dt, shape, is_weight=n in weights) for n, (dt, shape) in values.items()]
    g = make_graph("webgpu_ops", list(nodes), tensors, list(inputs), list(outputs))
    check(g)
    return g


def run(g: Graph, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray] | None = None,
        backend: Any = GPU) -> dict[str, np.ndarray]:
    exe = backend.compile(g, None, ArrayWeights(weights or {}), kv_state=False)
    try:
        return exe.run(feeds)
    finally:
        exe.close()


def grid(rng: np.random.Generator, shape: tuple[int, ...], scale: int, lo: int, hi: int) -> np.ndarray:
    """Values k / scale with lo <= |k| < hi: few enough bits that f32 sums and products of them are exact."""
    k = rng.integers(lo, hi, size=shape) * rng.choice([-1, 1], size=shape)
    return (k / scale).astype(np.float32)


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    return f32_to_bf16(x) if dtype == "bf16" else x.astype(DType.parse(dtype).numpy)


def ok(result: Any) -> None:
    assert result.ok, result


# --- rounding inside a chain ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_binary_chain_rounds_each_step(dtype: str) -> None:
    """(a * b) + d: the product is rounded to the dtype before the add, as the reference stores it; a device that
    only rounds at the edge rounds a*b + d once and differs."""
    rng = np.random.default_rng(1)
    scale, lo, hi = (64, 64, 256) if dtype == "f16" else (16, 16, 64)
    a, b, d = (as_dtype(grid(rng, (8, 32), scale, lo, hi), dtype) for _ in range(3))
    g = graph([node("Mul", ["a", "b"], ["p"]), node("Add", ["p", "d"], ["y"])],
              {n: (dtype, (8, 32)) for n in "abdpy"}, ["a", "b", "d"], ["y"])
    feeds = {"a": a, "b": b, "d": d}
    got, ref = run(g, feeds)["y"], evaluate(g, feeds, {})["y"]
    assert got.dtype == ref.dtype
    assert np.array_equal(got, ref), f"{int(np.sum(got != ref))} of {got.size} differ"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_in_shader_rounding_matches_the_host_across_the_range(dtype: str) -> None:
    """Products spanning subnormal, normal and overflowing results, and exact ties (3 * (1 + odd ulp)), rounded
    in-shader by the first Mul and carried unchanged by the second (times 1): the host's rounding, bit for bit."""
    rng = np.random.default_rng(6)
    frac = 10 if dtype == "f16" else 7
    a = np.ldexp(rng.uniform(1, 2, size=(6, 64)), rng.integers(-14, 9, size=(6, 64))).astype(np.float32)
    b = np.ldexp(rng.uniform(1, 2, size=(6, 64)), rng.integers(-14, 9, size=(6, 64))).astype(np.float32)
    a[0], b[0] = 3.0, 1.0 + np.arange(1, 129, 2)[:64] * 2.0 ** -frac  # ties between two neighbours of the grid
    a[1, :4], b[1, :4] = [255.0, 300.0, -255.0, 1.0], [257.0, 300.0, 256.0, 1.0]
    a, b = as_dtype(a, dtype), as_dtype(b, dtype)
    one = as_dtype(np.ones((6, 64), np.float32), dtype)
    g = graph([node("Mul", ["a", "b"], ["p"]), node("Mul", ["p", "one"], ["y"])],
              {n: (dtype, (6, 64)) for n in ("a", "b", "p", "one", "y")}, ["a", "b", "one"], ["y"])
    feeds = {"a": a, "b": b, "one": one}
    got, ref = run(g, feeds)["y"], evaluate(g, feeds, {})["y"]
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16)), f"{int(np.sum(got != ref))} differ"


def test_cast_to_bf16_keeps_nan_payloads_quiet() -> None:
    """NaNs of every sign and payload (all-ones mantissas carry into the sign when rounded as numbers) stay quiet
    NaNs of the reference's bits through Cast f32 -> bf16, next to ordinary values and infinities."""
    bits = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF,
                     0x7F80FFFF, 0x7F800000, 0xFF800000, 0x3F800000, 0x3F808000, 0x3F818000, 0x00000000],
                    np.uint32)
    x = bits.view(np.float32).reshape(2, 7)
    g = graph([node("Cast", ["x"], ["y"], to="bf16")], {"x": ("f32", (2, 7)), "y": ("bf16", (2, 7))}, ["x"], ["y"])
    got, ref = run(g, {"x": x})["y"], evaluate(g, {"x": x}, {})["y"]
    assert [hex(int(v)) for v in got.reshape(-1)] == [hex(int(v)) for v in ref.reshape(-1)]


CHAINS: list[tuple[str, dict[str, Any]]] = [
    ("RMSNorm", {}), ("LayerNorm", {}), ("AddRMSNorm", {}), ("SwiGLU", {}), ("GeGLU", {"approximate": "tanh"}),
    ("ReduceMean", {"axes": (0,)}), ("Silu", {}), ("Gelu", {}), ("Sub", {})]


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize(("op", "attrs"), CHAINS, ids=[c[0] for c in CHAINS])
def test_op_output_is_rounded_before_the_next_op(op: str, attrs: dict[str, Any], dtype: str) -> None:
    """op → Mul by (1 + one ulp): the product of a rounded value is exact in f32, so the device matches the reference
    bit for bit only when the op rounded its own output."""
    rng = np.random.default_rng(2)
    x = as_dtype(rng.uniform(-2, 2, size=(4, 32)).astype(np.float32), dtype)
    x2 = as_dtype(rng.uniform(-2, 2, size=(4, 32)).astype(np.float32), dtype)
    w = rng.uniform(0.5, 1.5, size=(32,)).astype(np.float32)
    values = {"x": (dtype, (4, 32)), "x2": (dtype, (4, 32)), "w": ("f32", (32,))}
    ins, outs = {"RMSNorm": (["x", "w"], ["h"]), "LayerNorm": (["x", "w"], ["h"]),
                 "AddRMSNorm": (["x", "x2", "w"], ["h", "s"]), "SwiGLU": (["x", "x2"], ["h"]),
                 "GeGLU": (["x", "x2"], ["h"]), "Sub": (["x", "x2"], ["h"])}.get(op, (["x"], ["h"]))
    hshape = (1, 32) if op == "ReduceMean" else (4, 32)
    values |= {"h": (dtype, hshape), "s": (dtype, (4, 32)), "c": (dtype, (32,)), "y": (dtype, hshape)}
    c = as_dtype(np.full(32, 1.0 + (2.0 ** -10 if dtype == "f16" else 2.0 ** -7), np.float32), dtype)
    g = graph([node(op, ins, outs, **attrs), node("Mul", ["h", "c"], ["y"])],
              {k: v for k, v in values.items() if k in {*ins, *outs, "c", "y"}}, [i for i in ins if i != "w"] + ["c"],
              ["y", *outs[1:]], weights=["w"])
    feeds = {"x": x, "x2": x2, "c": c}
    feeds = {k: v for k, v in feeds.items() if k in g.inputs}
    got, ref = run(g, feeds, {"w": w}), evaluate(g, feeds, {"w": w})
    for name in g.outputs:
        assert np.array_equal(got[name], ref[name]), f"{name}: {int(np.sum(got[name] != ref[name]))} differ"


def test_norm_weights_in_half_precision() -> None:
    """RMSNorm with f16 weights, LayerNorm with bf16 weight and bias: weights are read as f32 on the device."""
    b = Builder("RMSNorm", "f16_weight")
    x, w = b.input("x", "f32", (3, 48)), b.weight("w", "f16", (48,))
    ok(run_case(GPU, b.case([x, w], [("y", "f32", (3, 48))], eps=1e-6)))
    b = Builder("LayerNorm", "bf16_params")
    x = b.input("x", "bf16", (2, 3, 40))
    ps = [b.weight("w", "bf16", (3, 40)), b.weight("bias", "bf16", (3, 40))]
    ok(run_case(GPU, b.case([x, *ps], [("y", "bf16", (2, 3, 40))], 1e-2, axis=1)))


def test_add_rmsnorm_broadcasts_b_and_keeps_the_sum() -> None:
    b = Builder("AddRMSNorm", "broadcast")
    a, c, w = b.input("a", "f32", (5, 300)), b.input("b", "f32", (300,)), b.weight("w", "f32", (300,))
    ok(run_case(GPU, b.case([a, c, w], [("y", "f32", (5, 300)), ("sum", "f32", (5, 300))], add_unit_offset=True)))


# --- integers and broadcasting --------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "dtype", "a", "b"), [
    ("Neg", "i8", [-128, -1, 0, 127], None), ("Relu", "i16", [-32768, -5, 7, 32767], None),
    ("Add", "u8", [200, 255, 3, 0], [100, 1, 4, 0]), ("Mul", "i8", [100, -100, 16, 3], [2, 3, -8, 5]),
    ("Sub", "u32", [0, 5, 4_294_967_295, 1], [1, 5, 1, 2]), ("Div", "i32", [-7, 7, -8, 9], [2, -2, -3, 4])])
def test_narrow_and_unsigned_integers_wrap_like_the_host_type(op: str, dtype: str, a: list[int],
                                                              b: list[int] | None) -> None:
    """op, then Div by a constant: the division sees the wrapped (or unsigned) value only when the first op stored
    what the host type would hold."""
    nt = DType.parse(dtype).numpy
    feeds = {"a": np.array(a, dtype=np.int64).astype(nt), "two": np.array([2, 3, 2, 7], dtype=nt)}
    values = {"a": (dtype, (4,)), "two": (dtype, (4,)), "h": (dtype, (4,)), "y": (dtype, (4,))}
    if b is not None:
        feeds["b"], values["b"] = np.array(b, dtype=np.int64).astype(nt), (dtype, (4,))
    ins = ["a", "b"] if b is not None else ["a"]
    g = graph([node(op, ins, ["h"]), node("Div", ["h", "two"], ["y"])], values, list(feeds), ["h", "y"])
    got, ref = run(g, feeds), evaluate(g, feeds, {})
    for name in ("h", "y"):
        assert got[name].dtype == ref[name].dtype and np.array_equal(got[name], ref[name]), (name, got, ref)


def test_rank5_broadcast_and_rank9_same_shape() -> None:
    b = Builder("Sub", "rank5")
    x, y = b.input("a", "f32", (2, 1, 3, 1, 4)), b.input("b", "f32", (3, 1, 5, 4))
    ok(run_case(GPU, b.case([x, y], [("y", "f32", (2, 3, 3, 5, 4))])))
    b = Builder("Mul", "rank9")  # merges into one dim: the kernels' rank limit applies after merging
    shape = (2, 1, 2, 3, 1, 2, 2, 1, 3)
    x, y = b.input("a", "f32", shape), b.input("b", "f32", shape)
    ok(run_case(GPU, b.case([x, y], [("y", "f32", shape)])))


def test_broadcast_beyond_eight_dims_is_a_clear_error() -> None:
    sa, sb = (2, 1) * 5, (1, 2) * 5
    g = graph([node("Add", ["a", "b"], ["y"])], {"a": ("f32", sa), "b": ("f32", sb), "y": ("f32", (2,) * 10)},
              ["a", "b"], ["y"])
    with pytest.raises(BackendError, match=r"node 'n\d+/Add' indexes 10 dims.*at most 8"):
        run(g, {"a": np.ones(sa, np.float32), "b": np.ones(sb, np.float32)})


def test_nan_and_negative_sqrt_follow_the_reference() -> None:
    b = Builder("Sqrt", "negative")
    x = b.input("x", "f32", (6,), value=np.array([4.0, -1.0, 0.0, 2.0, -0.5, 9.0], np.float32))
    ok(run_case(GPU, b.case([x], [("y", "f32", (6,))])))


# --- the y dimension of the grid -----------------------------------------------------------------------------
def test_every_kernel_spills_into_the_y_dimension(monkeypatch: pytest.MonkeyPatch) -> None:
    """With at most 2 workgroups per dimension every kernel's grid needs y > 1 (rows, lines, outputs, elements)."""
    dev = OnDevice(fresh_device(monkeypatch, max_workgroups=2))
    rows = 7
    cases: list[Case] = []
    b = Builder("Gelu", "y_grid")
    cases.append(b.case([b.input("x", "f32", (rows, 300))], [("y", "f32", (rows, 300))]))
    b = Builder("Add", "y_grid")
    cases.append(b.case([b.input("a", "f32", (rows, 300)), b.input("b", "f32", (300,))], [("y", "f32", (rows, 300))]))
    b = Builder("RMSNorm", "y_grid")
    cases.append(b.case([b.input("x", "f32", (rows, 16)), b.weight("w", "f32", (16,))], [("y", "f32", (rows, 16))]))
    b = Builder("LayerNorm", "y_grid")
    cases.append(b.case([b.input("x", "f32", (rows, 16)), b.weight("w", "f32", (16,))], [("y", "f32", (rows, 16))]))
    b = Builder("SwiGLU", "y_grid")
    cases.append(b.case([b.input("x", "f32", (rows, 400))], [("y", "f32", (rows, 200))]))
    b = Builder("ReduceMean", "y_grid_rows")
    cases.append(b.case([b.input("x", "f32", (rows, 9))], [("y", "f32", (rows, 1))], axes=(1,)))
    b = Builder("ReduceMean", "y_grid_cols")
    cases.append(b.case([b.input("x", "f32", (3, 1200))], [("y", "f32", (1, 1200))], axes=(0,)))
    b = Builder("TopK", "y_grid")
    cases.append(b.case([b.input("x", "f32", (rows, 12))], [("v", "f32", (rows, 3)), ("i", "i64", (rows, 3))], 0.0,
                        k=3))
    b = Builder("Transpose", "y_grid")
    cases.append(b.case([b.input("x", "f32", (30, 40))], [("y", "f32", (40, 30))], 0.0, perm=(1, 0)))
    for case in cases:
        ok(run_case(dev, case))


# --- reductions ------------------------------------------------------------------------------------------------
def test_topk_over_more_elements_than_threads_with_ties_and_nan() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(-4, 4, size=(3, 300)).astype(np.float32)  # many ties
    x[1, 17] = x[2, 250] = np.nan
    for largest in (True, False):
        b = Builder("TopK", f"ties_{largest}")
        xi = b.input("x", "f32", x.shape, value=x)
        ok(run_case(GPU, b.case([xi], [("v", "f32", (3, 7)), ("i", "i64", (3, 7))], 0.0, k=7, largest=largest)))
    b = Builder("TopK", "i32_axis1")
    xi = b.input("x", "i32", (2, 5, 3))
    ok(run_case(GPU, b.case([xi], [("v", "i32", (2, 2, 3)), ("i", "i64", (2, 2, 3))], 0.0, k=2, axis=1)))


def test_argmax_takes_the_first_of_ties_and_nan() -> None:
    x = np.array([[1, 3, 3, 0], [np.nan, 5, np.nan, 1], [2, 2, 2, 2]], np.float32)
    b = Builder("ArgMax", "ties")
    ok(run_case(GPU, b.case([b.input("x", "f32", x.shape, value=x)], [("y", "i64", (3, 1))], 0.0)))


@pytest.mark.parametrize(("dtype", "axes", "keep", "out"), [
    ("f32", (0, 2), True, (1, 5, 1)), ("f16", (1, 2), False, (4,)), ("bf16", (-1,), False, (4, 5)),
    ("f32", (0, 1), False, (6,))])
def test_reduce_mean_of_several_axes(dtype: str, axes: tuple[int, ...], keep: bool, out: tuple[int, ...]) -> None:
    b = Builder("ReduceMean", f"{dtype}_{axes}")
    x = b.input("x", dtype, (4, 5, 6))
    ok(run_case(GPU, b.case([x], [("y", dtype, out)], 1e-2 if dtype != "f32" else 2e-5, axes=axes, keepdims=keep)))


# --- movement ------------------------------------------------------------------------------------------------
def test_slice_transpose_split_in_several_axes() -> None:
    b = Builder("Slice", "three_axes")
    x = b.input("x", "f32", (5, 6, 7))
    ok(run_case(GPU, b.case([x], [("y", "f32", (2, 3, 2))], 0.0, starts=(4, 1, -1), ends=(0, 6, 0), axes=(0, 1, 2),
                            steps=(-3, 2, -4))))
    b = Builder("Transpose", "rank4")
    x = b.input("x", "i64", (2, 3, 4, 5))
    ok(run_case(GPU, b.case([x], [("y", "i64", (4, 2, 5, 3))], 0.0, perm=(2, 0, 3, 1))))
    b = Builder("Split", "equal_middle")
    x = b.input("x", "f16", (2, 6, 3))
    ok(run_case(GPU, b.case([x], [(f"y{i}", "f16", (2, 2, 3)) for i in range(3)], 0.0, axis=1)))


def test_reshape_and_transpose_of_weights() -> None:
    b = Builder("Reshape", "weight")
    w = b.weight("w", "f16", (4, 6))
    ok(run_case(GPU, b.case([w], [("y", "f16", (2, 12))], 0.0, shape=(2, 12))))
    b = Builder("Transpose", "bf16_weight")
    w = b.weight("w", "bf16", (3, 5))
    ok(run_case(GPU, b.case([w], [("y", "bf16", (5, 3))], 0.0)))


def _raw_rows(raws: Sequence[np.ndarray], rows: Sequence[int], axis: int) -> np.ndarray:
    parts = [np.asarray(r).reshape(n, -1) for r, n in zip(raws, rows, strict=True)]
    return np.concatenate(parts, axis=axis).reshape(-1)


@pytest.mark.parametrize(("qt", "shapes", "axis"), [
    ("q8_0", [(3, 32), (2, 32)], 0),  # 102 + 68 bytes: the second input starts inside a word
    ("q8_0", [(2, 32), (2, 64)], 1),  # rows of 34 | 68 bytes
    ("q4_0", [(2, 64), (3, 64)], 0),  # 36-byte rows: every run word aligned, copied as words
    ("q4_k", [(1, 256), (2, 256)], 0)])
def test_quantized_concat_is_a_byte_exact_copy(qt: str, shapes: list[tuple[int, int]], axis: int) -> None:
    rng = np.random.default_rng(4)
    dt = DType.parse(qt)
    raws = [quantize(rng.uniform(-1, 1, size=s).astype(np.float32), dt) for s in shapes]
    out = (shapes[0][0], sum(s[1] for s in shapes)) if axis else (sum(s[0] for s in shapes), shapes[0][1])
    values = {f"w{i}": (qt, s) for i, s in enumerate(shapes)} | {"y": (qt, out)}
    g = graph([node("Concat", list(values)[:-1], ["y"], axis=axis)], values, [], ["y"], weights=list(values)[:-1])
    got = run(g, {}, {f"w{i}": r for i, r in enumerate(raws)})["y"]
    assert np.array_equal(got.reshape(-1), _raw_rows(raws, [s[0] for s in shapes], axis))


def test_quantized_cut_inside_a_block_is_a_clear_error() -> None:
    g = graph([node("Slice", ["w"], ["y"], starts=(16,), ends=(48,), axes=(1,))],
              {"w": ("q8_0", (2, 64)), "y": ("q8_0", (2, 32))}, [], ["y"], weights=["w"])
    raw = quantize(np.ones((2, 64), np.float32), DType.Q8_0)
    with pytest.raises(BackendError, match=r"cuts q8_0 value 'w' at element 16 of its last axis"):
        run(g, {}, {"w": raw})


def test_slice_and_split_of_a_weight_in_row_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 256-byte binding limit cuts a 12-row q8_0 weight (34-byte rows) into shards of 7 + 5 rows; a reversed
    slice and a split read across the shard boundary."""
    dev = OnDevice(fresh_device(monkeypatch, max_binding=256))
    rng = np.random.default_rng(5)
    raw = quantize(rng.uniform(-1, 1, size=(12, 32)).astype(np.float32), DType.Q8_0)
    rows = np.asarray(raw).reshape(12, -1)
    g = graph([node("Slice", ["w"], ["y"], starts=(9,), ends=(0,), axes=(0,), steps=(-3,))],
              {"w": ("q8_0", (12, 32)), "y": ("q8_0", (3, 32))}, [], ["y"], weights=["w"])
    assert np.array_equal(run(g, {}, {"w": raw}, dev)["y"].reshape(-1), rows[9:0:-3].reshape(-1))
    g = graph([node("Split", ["w"], ["a", "b"], axis=0, split=(5, 7))],
              {"w": ("q8_0", (12, 32)), "a": ("q8_0", (5, 32)), "b": ("q8_0", (7, 32))}, [], ["a", "b"],
              weights=["w"])
    got = run(g, {}, {"w": raw}, dev)
    assert np.array_equal(got["a"].reshape(-1), rows[:5].reshape(-1))
    assert np.array_equal(got["b"].reshape(-1), rows[5:].reshape(-1))
