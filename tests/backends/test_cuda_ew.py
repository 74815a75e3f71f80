"""ew.cu's kernels (the ops ONNX graphs bring) launched directly, on the host model with their references, with their
CUDA source built by the host compiler, and on a CUDA device where there is one: against numpy and uaii-ir's
references, for what the conformance suite's whole-graph cases do not pin down — a grid covering only part of the
items, integers wrapping at the device's 32 bits, f16 / bf16 rounding, TopK's order with ties and NaN, faults
written (and the run raising, naming the node) instead of wrong values.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from uaii.backends.base import ArrayWeights, BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.reference_ew import round_to
from uaii.backends.testing.cases import Builder
from uaii.ir import DType
from uaii.ir.reference.reduce import topk

Int, Long, Flt, Ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_float, ctypes.c_uint64
NULL = Ptr(0)


@pytest.fixture
def dev(cuda_dev: Any) -> Any:
    """conftest's cuda_dev: the host model (references, or the kernels' CUDA source) and a device where there is one."""
    return cuda_dev


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261203)


def _table(dev: Any, *rows: list[int]) -> Any:
    return dev.upload(np.array([v for r in rows for v in r], np.int64))


def _run(dev: Any, kernel: str, at: geometry.Launch, *args: Any) -> None:
    dev.launch("ew", kernel, at, *args)
    dev.synchronize()


def test_broadcast_arithmetic_and_a_partial_grid(dev: Any, rng: np.random.Generator) -> None:
    """binary_f over [3, 4, 5] with b [4, 1]: every op against numpy; a grid of one 256-thread block over 300 items
    leaves the rest as they were."""
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    b = (rng.standard_normal((4, 1)) + 3).astype(np.float32)
    da, db = dev.upload(a), dev.upload(b)
    t = _table(dev, [3, 4, 5], [20, 5, 1], [0, 1, 0])
    want = {0: a + b, 1: a - b, 2: a * b, 3: a / b, 5: np.maximum(a, b), 6: np.minimum(a, b), 7: np.fmod(a, b),
            4: (np.abs(a).astype(np.float64) ** b.astype(np.float64)).astype(np.float32)}
    for op, w in want.items():
        dy = dev.upload(np.full(60, -7.25, np.float32))
        src = dev.upload(np.abs(a)) if op == 4 else da
        _run(dev, "binary_f", geometry.elementwise(60), src, db, dy, t, Int(3), Long(60), Int(op), Int(0))
        np.testing.assert_allclose(dev.download(dy, (3, 4, 5), np.float32), w, rtol=1e-6, err_msg=str(op))
    big = dev.upload(np.full(300, -7.25, np.float32))
    t1 = _table(dev, [300], [1], [1])
    x = rng.standard_normal(300).astype(np.float32)
    dx = dev.upload(x)
    _run(dev, "binary_f", geometry.Launch((1, 1, 1), (256, 1, 1)), dx, dx, big, t1, Int(1), Long(300), Int(0), Int(0))
    got = dev.download(big, (300,), np.float32)
    np.testing.assert_array_equal(got[:256], x[:256] * 2)
    assert np.all(got[256:] == np.float32(-7.25))


def test_integers_wrap_at_32_bits_and_a_zero_divisor_faults(dev: Any) -> None:
    big = np.array([2 ** 31 - 1, -2 ** 31, 7, -7, 9], np.int32)
    by = np.array([1, -1, 2, 2, 0], np.int32)
    da, db, dy, fault = dev.upload(big), dev.upload(by), dev.upload(np.zeros(5, np.int32)), dev.upload(
        np.zeros(1, np.int32))
    t = _table(dev, [5], [1], [1])
    at = geometry.elementwise(5)
    _run(dev, "binary_i", at, da, db, dy, t, Int(1), Long(5), Int(0), fault, Int(3), Int(0))
    assert dev.download(dy, (5,), np.int32).tolist() == [-2 ** 31, 2 ** 31 - 1, 9, -5, 9]
    assert dev.download(fault, (1,), np.int32)[0] == 0
    _run(dev, "binary_i", at, da, db, dy, t, Int(1), Long(5), Int(3), fault, Int(3), Int(0))
    assert dev.download(dy, (5,), np.int32).tolist() == [2 ** 31 - 1, -2 ** 31, 3, -3, 0]  # toward zero; INT_MIN/-1
    assert dev.download(fault, (1,), np.int32)[0] == 3
    mod, dm = dev.upload(np.zeros(5, np.int32)), dev.upload(np.array([3, -5, 2, 2, -5], np.int32))
    for op, ref in ((6, np.mod), (7, np.fmod)):  # the divisor's sign (Python's), then the dividend's (C's)
        _run(dev, "binary_i", at, da, dm, mod, t, Int(1), Long(5), Int(op), fault, Int(3), Int(0))
        assert dev.download(mod, (5,), np.int32).tolist() == ref(big.astype(np.int64), [3, -5, 2, 2, -5]).tolist()
    f2 = dev.upload(np.zeros(1, np.int32))
    _run(dev, "unary_i", at, da, Long(5), dy, Int(0), f2, Int(4), Int(0))
    assert dev.download(dy, (5,), np.int32).tolist() == [-2 ** 31 + 1, -2 ** 31, -7, 7, -9]
    assert dev.download(f2, (1,), np.int32)[0] == 0  # an i32 wraps as the host type does
    _run(dev, "unary_i", at, da, Long(5), dy, Int(0), f2, Int(4), Int(1))
    assert dev.download(f2, (1,), np.int32)[0] == 4  # an i64's -(-2^31) is 2^31: beyond the word, a fault
    _run(dev, "binary_i", at, da, db, dy, t, Int(1), Long(5), Int(2), fault, Int(6), Int(1))
    assert dev.download(fault, (1,), np.int32)[0] == 6  # (2^31 - 1) * 1 fits, -2^31 * -1 does not


def test_casts_round_as_numpy(dev: Any, rng: np.random.Generator) -> None:
    """float → f16 / bf16 (nearest even, as the CPU's conversions), float → int half to even and saturated, a
    value beyond 32 bits faulting."""
    x = np.concatenate([rng.standard_normal(200) * 1e3, [0.5, 1.5, 2.5, -0.5, np.nan, 1e10, -1e10, 65520.0]])
    x = x.astype(np.float32)
    n = x.size
    dx, dy = dev.upload(x), dev.upload(np.zeros(n, np.float32))
    at = geometry.elementwise(n)
    with np.errstate(over="ignore"):  # 1e10 overflows f16 to inf, as on the device
        halves = x.astype(np.float16).astype(np.float32)
    for rnd, want in ((1, halves), (2, round_to(x, 2))):
        _run(dev, "cast_f", at, dx, Long(n), dy, Int(rnd))
        np.testing.assert_array_equal(dev.download(dy, (n,), np.float32), want)
    from uaii.backends.cpu.bind import from_f32, to_f32
    from uaii.ir import DType

    assert np.array_equal(round_to(x, 2), to_f32(from_f32(x, DType.BF16), DType.BF16), equal_nan=True)
    di, fault = dev.upload(np.zeros(n, np.int32)), dev.upload(np.zeros(1, np.int32))
    _run(dev, "cast_f2i", at, dx, Long(n), di, Long(-128), Long(127), Int(0), fault, Int(5))
    want_i = np.clip(np.rint(np.nan_to_num(x.astype(np.float64), nan=0.0)), -128, 127).astype(np.int32)
    np.testing.assert_array_equal(dev.download(di, (n,), np.int32), want_i)
    assert dev.download(fault, (1,), np.int32)[0] == 0
    _run(dev, "cast_f2i", at, dx, Long(n), di, Long(-2 ** 63), Long(2 ** 63 - 1), Int(0), fault, Int(5))
    assert dev.download(fault, (1,), np.int32)[0] == 5  # 1e10 into an i64 does not fit the device's word


def test_topk_and_argmax_order_ties_and_nan_as_the_reference(dev: Any, rng: np.random.Generator) -> None:
    x = rng.integers(-3, 4, size=(6, 11)).astype(np.float32)
    x[2, 4] = x[4, 0] = np.nan
    dx = dev.upload(x)
    for largest in (1, 0):
        vals, idx = dev.upload(np.zeros((6, 4), np.float32)), dev.upload(np.zeros((6, 4), np.int32))
        _run(dev, "topk_ax", geometry.elementwise(6), dx, vals, idx, Long(11), Long(1), Long(6), Int(4), Int(largest),
             Int(0))
        want_v, want_i = topk(x, k=4, axis=-1, largest=bool(largest))
        np.testing.assert_array_equal(dev.download(idx, (6, 4), np.int32), want_i)
        np.testing.assert_array_equal(dev.download(vals, (6, 4), np.float32), want_v)
    am = dev.upload(np.zeros(11, np.int32))
    _run(dev, "argmax_ax", geometry.elementwise(11), dx, am, Long(6), Long(11), Long(11), Int(0))
    np.testing.assert_array_equal(dev.download(am, (11,), np.int32), np.argmax(x, axis=0))


def test_reductions_softmax_and_cumsum_against_numpy(dev: Any, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    dx = dev.upload(x)
    # sum / mean / max / min over axes (0, 2): kept [4] (stride 5), reduced [3, 5] (strides 20, 1)
    t = _table(dev, [4], [5], [3, 5], [20, 1])
    for op, fn in ((0, np.sum), (1, np.mean), (2, np.max), (3, np.min)):
        dy = dev.upload(np.zeros(4, np.float32))
        _run(dev, "reduce_f", geometry.elementwise(4), dx, dy, t, Int(1), Int(2), Long(4), Long(15), Int(op), Int(0))
        np.testing.assert_allclose(dev.download(dy, (4,), np.float32), fn(x.astype(np.float64), axis=(0, 2)),
                                   rtol=1e-6)
    dy = dev.upload(np.zeros(60, np.float32))
    _run(dev, "softmax_ax", geometry.elementwise(15), dx, dy, Long(4), Long(5), Long(15), Int(0))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(dev.download(dy, (3, 4, 5), np.float32), e / e.sum(axis=1, keepdims=True), rtol=1e-6)
    _run(dev, "cumsum_f", geometry.elementwise(15), dx, dy, Long(4), Long(5), Long(15), Int(1), Int(1), Int(0))
    rev = np.flip(np.cumsum(np.flip(x, 1), axis=1), 1) - x  # exclusive, reversed
    np.testing.assert_allclose(dev.download(dy, (3, 4, 5), np.float32), rev, rtol=1e-5, atol=1e-6)


def test_general_product_broadcasts_batches_and_transposes(dev: Any, rng: np.random.Generator) -> None:
    """matmul_f: a [2, 1, 3, 7] times b [4, 7, 5] (batch broadcast to [2, 4]), and Gemm's transposes with a bias
    column and relu."""
    a = rng.standard_normal((2, 1, 3, 7)).astype(np.float32)
    b = rng.standard_normal((4, 7, 5)).astype(np.float32)
    da, db, dy = dev.upload(a), dev.upload(b), dev.upload(np.zeros(2 * 4 * 15, np.float32))
    t = _table(dev, [2, 4], [21, 0], [0, 35], [0, 0], [7, 1, 5, 1, 0, 0])
    _run(dev, "matmul_f", geometry.elementwise(120), da, db, NULL, dy, t, Int(2), Long(3), Long(5), Long(7),
         Long(120), Flt(1.0), Flt(1.0), Int(0), Int(0))
    np.testing.assert_allclose(dev.download(dy, (2, 4, 3, 5), np.float32), a @ b, rtol=1e-5, atol=1e-6)
    at_, bt = rng.standard_normal((7, 3)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
    c = rng.standard_normal((3, 1)).astype(np.float32)
    d1, d2, dc, dz = dev.upload(at_), dev.upload(bt), dev.upload(c), dev.upload(np.zeros(15, np.float32))
    t2 = _table(dev, [], [], [], [], [1, 3, 1, 7, 1, 0])
    _run(dev, "matmul_f", geometry.elementwise(15), d1, d2, dc, dz, t2, Int(0), Long(3), Long(5), Long(7), Long(15),
         Flt(0.5), Flt(2.0), Int(1), Int(0))
    np.testing.assert_allclose(dev.download(dz, (3, 5), np.float32), np.maximum(0.5 * at_.T @ bt.T + 2 * c, 0),
                               rtol=1e-5, atol=1e-6)


def _gather_graph(indices: np.ndarray) -> Any:
    b = Builder("Gather", "fault")
    data = b.input("data", "f32", (5, 3))
    idx = b.input("idx", "i64", indices.shape, value=indices)
    return b.case([data, idx], [("y", "f32", (*indices.shape, 3))], 0.0, axis=0)


def test_an_index_out_of_range_raises_naming_the_node_and_the_next_run_is_clean() -> None:
    case = _gather_graph(np.array([0, -1, 4], np.int64))
    exe = CudaBackend(device=HostDevice(kernels="compiled")).compile(case.graph, None, ArrayWeights(case.weights))
    got = exe.run(case.feeds)["y"]
    np.testing.assert_array_equal(got, case.feeds["data"][[0, 4, 4]])
    with pytest.raises(BackendError, match=r"node 'fault/Gather': an index out of range for axis 0 of size 5"):
        exe.run({**case.feeds, "idx": np.array([0, 5, 1], np.int64)})
    np.testing.assert_array_equal(exe.run(case.feeds)["y"], got)  # the fault word is cleared for each run
    with pytest.raises(BackendError, match=r"input 'idx'.*4294967296 lies beyond the device's 32-bit integers"):
        exe.run({**case.feeds, "idx": np.array([0, 2 ** 32, 1], np.int64)})
    exe.close()


def test_integer_division_by_zero_raises_instead_of_a_value() -> None:
    b = Builder("Div", "by_zero")
    x = b.input("a", "i32", (4,), value=np.array([7, -7, 3, 1], np.int32))
    y = b.input("b", "i32", (4,), value=np.array([2, 2, 1, 1], np.int32))
    case = b.case([x, y], [("y", "i32", (4,))], 0.0)
    exe = CudaBackend(device=HostDevice()).compile(case.graph, None, ArrayWeights(case.weights))
    assert exe.run(case.feeds)["y"].tolist() == [3, -3, 3, 1]
    with pytest.raises(BackendError, match="integer division by zero"):
        exe.run({**case.feeds, "b": np.array([2, 0, 1, 1], np.int32)})
    exe.close()


def test_a_token_id_outside_the_table_raises_naming_the_node() -> None:
    """Embedding's rows kernel faults on an id outside [0, vocab) (the CPU reference's error), resident or not."""
    b = Builder("Embedding", "bad_id")
    ids = b.input("ids", "i32", (3,), value=np.array([0, 5, 2], np.int32))
    table = b.weight("table", "q8_0", (6, 64))
    case = b.case([ids, table], [("y", "f32", (3, 64))], 0.0)
    exe = CudaBackend(device=HostDevice(kernels="compiled")).compile(case.graph, None, ArrayWeights(case.weights))
    good = exe.run(case.feeds)["y"]
    for bad in (6, -1):
        with pytest.raises(BackendError, match=r"node 'bad_id/Embedding': a token id outside the table's 6 rows"):
            exe.run({"ids": np.array([0, bad, 2], np.int32)})
    np.testing.assert_array_equal(exe.run(case.feeds)["y"], good)
    exe.close()


def test_integer_arithmetic_on_i64_faults_beyond_32_bits() -> None:
    """An i64 product that leaves the device's word raises (the host's 64 bits would hold it), an empty integer
    ReduceMax of i64 is refused (its identity does not fit), and i32 wraps as numpy's int32 does."""
    for dtype, raises in (("i64", True), ("i32", False)):
        b = Builder("Mul", f"wide_{dtype}")
        x = b.input("a", dtype, (2,), value=np.array([70000, 3], DType.parse(dtype).numpy))
        case = b.case([x, b.input("b", dtype, (2,), value=np.array([70000, 3], DType.parse(dtype).numpy))],
                      [("y", dtype, (2,))], 0.0)
        exe = CudaBackend(device=HostDevice()).compile(case.graph, None, ArrayWeights(case.weights))
        if raises:
            with pytest.raises(BackendError, match=r"'wide_i64/Mul': an i64 result beyond the device's 32-bit"):
                exe.run(case.feeds)
        else:
            assert exe.run(case.feeds)["y"].tolist() == (np.array([70000, 3], np.int32) ** 2).tolist()
        exe.close()
    b = Builder("ReduceMax", "empty_i64")
    case = b.case([b.input("x", "i64", (3, 0), value=np.zeros((3, 0), np.int64))], [("y", "i64", (3, 1))], 0.0,
                  axes=(1,))
    with pytest.raises(BackendError, match="an empty ReduceMax of i64"):
        CudaBackend(device=HostDevice()).compile(case.graph, None, ArrayWeights(case.weights)).run(case.feeds)
