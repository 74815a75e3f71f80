"""Conformance cases of the ops ONNX graphs brought into the IR: math (Erf ... Mod), comparisons and logic, Where and
Trilu, the reductions ReduceSum/Max/Min and CumSum, and the ops with data-dependent shapes (Shape, Range, Fill,
Expand), whose deciding inputs come both as constants and as fed values. Infinities stay out of these cases (the
normalized error of inf - inf is NaN): the IR's tests cover them against NumPy.
"""

from __future__ import annotations

import numpy as np

from uaii.backends.testing.cases import F32, LOW, Builder, Case, binary_case, unary_case
from uaii.ir import DType


def _away_from_zero(b: Builder, dtype: str, shape: tuple[int, ...], low: float = 0.25) -> np.ndarray:
    """Values in [-3, -low] or [low, 3] (bf16 as words)."""
    mag = b.rng.uniform(low, 3.0, size=shape)
    v = np.where(b.rng.random(shape) < 0.5, -mag, mag)
    if dtype == "bf16":
        from uaii.backends.cpu.bind import from_f32

        return from_f32(v.astype(np.float32), DType.BF16)
    return v.astype(DType.parse(dtype).numpy)


def _words(dtype: str, value: object) -> np.ndarray:
    """``value`` as a 0-d array of ``dtype`` in its stored form (bf16 as its word)."""
    if dtype == "bf16":
        from uaii.backends.cpu.bind import from_f32

        return from_f32(np.asarray(value, np.float32), DType.BF16).reshape(())
    return np.asarray(value, DType.parse(dtype).numpy)


def math_ops() -> list[Case]:
    out = []
    for op in ("Erf", "Cos", "Sin", "Abs"):
        out += [unary_case(op, "decode", "f32", (1, 64)), unary_case(op, "prefill", "f32", (7, 33)),
                unary_case(op, "f16", "f16", (3, 16), tol=LOW)]
    out += [unary_case("Erf", "wide", "f32", (4, 50), low=-6.0), unary_case("Erf", "bf16", "bf16", (4, 8), tol=LOW),
            unary_case("Abs", "i32", "i32", (4, 5)), unary_case("Abs", "bf16", "bf16", (3, 8), tol=LOW),
            unary_case("Cos", "large", "f32", (3, 40), low=-100.0)]
    for name, dtype, shape, tol in (("decode", "f32", (1, 64), F32), ("prefill", "f32", (6, 20), F32),
                                    ("f16", "f16", (3, 16), LOW)):
        b = Builder("Log", name)
        x = b.input("x", dtype, shape, low=0.05, high=20.0)
        out.append(b.case([x], [("y", dtype, shape)], tol))
        b = Builder("Reciprocal", name)
        x = b.input("x", dtype, shape, value=_away_from_zero(b, dtype, shape))
        out.append(b.case([x], [("y", dtype, shape)], tol))
    for op in ("Max", "Min"):
        out += [binary_case(op, "same", "f32", (1, 64), (1, 64)), binary_case(op, "broadcast", "f32", (5, 8), (8,)),
                binary_case(op, "i64", "i64", (3, 7), (3, 1)), binary_case(op, "f16", "f16", (4, 6), (1, 6), tol=LOW),
                binary_case(op, "bf16", "bf16", (3, 8), (3, 8), tol=LOW)]
    out.append(binary_case("Max", "weight", "f32", (6, 16), (16,), weight_b=True))
    b = Builder("Pow", "positive_base")
    a = b.input("a", "f32", (5, 8), low=0.1, high=3.0)
    e = b.input("b", "f32", (8,), low=-2.0, high=2.5)
    out.append(b.case([a, e], [("y", "f32", (5, 8))]))
    b = Builder("Pow", "integer_exponents")  # a negative base is defined for whole exponents
    a = b.input("a", "f32", (4, 6))
    e = b.input("b", "f32", (1, 6), value=np.array([[-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]], np.float32))
    out.append(b.case([a, e], [("y", "f32", (4, 6))]))
    b = Builder("Pow", "f16")
    a = b.input("a", "f16", (3, 8), low=0.5, high=2.0)
    e = b.input("b", "f16", (3, 8), low=-1.0, high=2.0)
    out.append(b.case([a, e], [("y", "f16", (3, 8))], LOW))
    out += _mod_cases()
    return out


def _mod_cases() -> list[Case]:
    out = []
    for name, dtype, fmod in (("i64_python_sign", "i64", False), ("i32_c_sign", "i32", True),
                              ("i64_c_sign", "i64", True)):
        b = Builder("Mod", name)
        a = b.input("a", dtype, (4, 6))
        divisor = b.rng.integers(1, 7, size=(6,)) * np.where(b.rng.random(6) < 0.5, -1, 1)
        c = b.input("b", dtype, (6,), value=divisor.astype(DType.parse(dtype).numpy))
        out.append(b.case([a, c], [("y", dtype, (4, 6))], 0.0, fmod=fmod))
    b = Builder("Mod", "f32_fmod")
    a = b.input("a", "f32", (3, 8), low=-10.0, high=10.0)
    c = b.input("b", "f32", (3, 8), value=_away_from_zero(b, "f32", (3, 8), low=0.5))
    out.append(b.case([a, c], [("y", "f32", (3, 8))], F32, fmod=True))
    return out


def _small_ints(b: Builder, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values from {-2, ..., 2}: equal pairs are common, so every comparison has both outcomes."""
    v = b.rng.integers(-2, 3, size=shape).astype(np.float32)
    if dtype == "bf16":
        from uaii.backends.cpu.bind import from_f32

        return from_f32(v, DType.BF16)
    return v.astype(DType.parse(dtype).numpy)


def logic_ops() -> list[Case]:
    out = []
    for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        for name, dtype, sa, sb in (("broadcast", "f32", (5, 8), (8,)), ("i64", "i64", (3, 7), (3, 7)),
                                    ("f16", "f16", (4, 6), (1, 6)), ("bf16", "bf16", (2, 5), (2, 1))):
            b = Builder(op, name)
            a = b.input("a", dtype, sa, value=_small_ints(b, dtype, sa))
            c = b.input("b", dtype, sb, value=_small_ints(b, dtype, sb))
            out.append(b.case([a, c], [("y", "bool", np.broadcast_shapes(sa, sb))], 0.0))
    b = Builder("Equal", "bool")
    a = b.input("a", "bool", (4, 5), value=b.rng.random((4, 5)) < 0.5)
    c = b.input("b", "bool", (5,), value=b.rng.random(5) < 0.5)
    out.append(b.case([a, c], [("y", "bool", (4, 5))], 0.0))
    b = Builder("Less", "weight")
    a = b.input("a", "f32", (3, 16))
    w = b.weight("w", "f32", (16,))
    out.append(b.case([a, w], [("y", "bool", (3, 16))], 0.0))
    for op in ("And", "Or", "Xor"):
        pairs: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = [("same", (4, 6), (4, 6)),
                                                                     ("broadcast", (3, 1, 5), (4, 1))]
        for name, la, lb in pairs:
            b = Builder(op, name)
            a = b.input("a", "bool", la, value=b.rng.random(la) < 0.5)
            c = b.input("b", "bool", lb, value=b.rng.random(lb) < 0.5)
            out.append(b.case([a, c], [("y", "bool", np.broadcast_shapes(la, lb))], 0.0))
    b = Builder("Not", "bool")
    out.append(b.case([b.input("x", "bool", (5, 7), value=b.rng.random((5, 7)) < 0.5)], [("y", "bool", (5, 7))], 0.0))
    return out + _select_cases()


def _select_cases() -> list[Case]:
    out = []
    wheres: list[tuple[str, str, tuple[tuple[int, ...], ...]]] = [
        ("broadcast3", "f32", ((4, 1, 6), (1, 5, 6), (6,))), ("i64", "i64", ((3, 4),) * 3),
        ("bf16", "bf16", ((2, 8), (2, 8), (1, 8))), ("f16_scalar", "f16", ((5, 3), (5, 3), ()))]
    for name, dtype, shapes in wheres:
        b = Builder("Where", name)
        cond = b.input("cond", "bool", shapes[0], value=b.rng.random(shapes[0]) < 0.5)
        x, y = b.input("x", dtype, shapes[1]), b.input("y", dtype, shapes[2])
        out.append(b.case([cond, x, y], [("out", dtype, np.broadcast_shapes(*shapes))], 0.0))
    b = Builder("Where", "bool_values")
    cond = b.input("cond", "bool", (4, 4), value=np.tri(4, dtype=bool))
    x = b.input("x", "bool", (4, 4), value=b.rng.random((4, 4)) < 0.5)
    y = b.input("y", "bool", (1,), value=np.array([False]))
    out.append(b.case([cond, x, y], [("out", "bool", (4, 4))], 0.0))
    b = Builder("Where", "weight")
    cond = b.input("cond", "bool", (3, 16), value=b.rng.random((3, 16)) < 0.5)
    x, y = b.input("x", "f32", (3, 16)), b.weight("y", "f32", (16,))
    out.append(b.case([cond, x, y], [("out", "f32", (3, 16))], 0.0))
    trilus: list[tuple[str, str, tuple[int, ...], bool, int]] = [
        ("upper", "f32", (5, 7), True, 0), ("lower_below", "f32", (2, 4, 4), False, -1),
        ("upper_above", "i64", (6, 3), True, 2), ("lower_above", "f16", (3, 5), False, 3),
        ("causal_bool", "bool", (6, 6), False, 0), ("beyond", "f32", (3, 4), True, -9)]
    for name, dtype, shape, upper, k in trilus:
        b = Builder("Trilu", name)
        x = b.input("x", dtype, shape, value=(b.rng.random(shape) < 0.7) if dtype == "bool" else None)
        out.append(b.case([x], [("y", dtype, shape)], 0.0, upper=upper, k=k))
    return out


def reduce_ops() -> list[Case]:
    out = []
    specs: list[tuple[str, str, tuple[int, ...], dict[str, object], tuple[int, ...], float]] = [
        ("decode", "f32", (1, 64), dict(axes=(-1,)), (1, 1), F32),
        ("tokens", "f32", (9, 40), dict(axes=(0,), keepdims=False), (40,), F32),
        ("all_axes", "f32", (4, 6), dict(keepdims=False), (), F32),
        ("middle", "i64", (3, 5, 4), dict(axes=(1,)), (3, 1, 4), 0.0),
        ("f16", "f16", (6, 16), dict(axes=(-2,)), (1, 16), LOW),
        ("bf16", "bf16", (5, 8), dict(axes=(1,)), (5, 1), LOW)]
    for op in ("ReduceSum", "ReduceMax", "ReduceMin"):
        for name, dtype, xshape, attrs, yshape, tol in specs:
            b = Builder(op, name)
            x = b.input("x", dtype, xshape)
            out.append(b.case([x], [("y", dtype, yshape)], tol, params=attrs))
    b = Builder("ReduceSum", "empty_axis")  # an empty reduction sums to 0
    x = b.input("x", "f32", (3, 0), value=np.zeros((3, 0), np.float32))
    out.append(b.case([x], [("y", "f32", (3, 1))], F32, axes=(1,)))
    scans: list[tuple[str, str, tuple[int, ...], dict[str, object], float]] = [
        ("rows", "f32", (6, 5), dict(axis=0), F32), ("exclusive", "f32", (3, 9), dict(axis=-1, exclusive=True), F32),
        ("reverse", "f32", (4, 7), dict(axis=1, reverse=True), F32),
        ("exclusive_reverse", "f32", (2, 3, 5), dict(axis=1, exclusive=True, reverse=True), F32),
        ("f16", "f16", (3, 12), dict(axis=-1), LOW)]
    for name, dtype, shape, attrs, tol in scans:
        b = Builder("CumSum", name)
        out.append(b.case([b.input("x", dtype, shape)], [("y", dtype, shape)], tol, params=attrs))
    b = Builder("CumSum", "position_ids")  # position ids from an attention mask, as exported LMs compute them
    mask = b.input("mask", "i64", (2, 7), value=np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], np.int64))
    out.append(b.case([mask], [("y", "i64", (2, 7))], 0.0, axis=1))
    return out


def shape_ops() -> list[Case]:
    out = []
    shapes: list[tuple[str, str, tuple[int, ...], dict[str, object], int]] = [
        ("all", "f32", (3, 5, 7), {}, 3), ("start", "f32", (2, 4, 6, 8), {"start": 1}, 3),
        ("negative", "bool", (2, 4, 6, 8), {"start": -3, "end": -1}, 2),
        ("clamped", "i64", (4, 5), {"start": -9, "end": 9}, 2), ("empty", "f16", (4, 5), {"start": 1, "end": 1}, 0)]
    for name, dtype, shape, attrs, n in shapes:
        b = Builder("Shape", name)
        x = b.input("x", dtype, shape, value=np.zeros(shape, bool) if dtype == "bool" else None)
        out.append(b.case([x], [("y", "i64", (n,))], 0.0, params=attrs))
    ranges: list[tuple[str, str, tuple[float, float, float], bool]] = [
        ("i64_fed", "i64", (0, 10, 3), True), ("i32_const", "i32", (-4, 7, 2), False),
        ("f32_negative_delta", "f32", (5.0, -1.0, -1.5), True), ("i64_empty", "i64", (5, 5, 1), True),
        ("f32_const", "f32", (0.5, 2.0, 0.25), False), ("i64_reversed_empty", "i64", (3, 9, -2), False)]
    for name, dtype, (lo, hi, step), fed in ranges:
        b = Builder("Range", name)
        np_dt = DType.parse(dtype).numpy
        vals = [np.asarray(v, np_dt) for v in (lo, hi, step)]
        names = ("start", "limit", "delta")
        ins = [b.input(k, dtype, (), value=v) if fed else b.const(k, v) for k, v in zip(names, vals, strict=True)]
        n = len(np.arange(lo, hi, step))
        out.append(b.case(ins, [("y", dtype, (n,))], 0.0))
    fills: list[tuple[str, list[int], bool, str, object, bool]] = [  # name, shape, shape fed, dtype, value, fed
        ("f32_const", [2, 3], False, "f32", 1.5, False), ("i64_fed", [3, 4], True, "i64", -2, True),
        ("i64_beyond_2_53", [2], False, "i64", (1 << 53) + 1, False), ("i64_max_fed", [3], True, "i64",
                                                                       (1 << 63) - 1, True),
        ("bool", [5], False, "bool", True, False), ("scalar", [], False, "f32", 7.0, False),
        ("zero_dim", [0, 4], True, "f32", 3.0, False), ("bf16", [2, 2], False, "bf16", 0.3, False),
        ("bf16_fed_1d", [3], False, "bf16", -2.5, True), ("f16_1d", [2, 1], False, "f16", 0.1, False),
        ("i32_fed", [4], True, "i32", -7, True)]
    for name, dims, shape_fed, odt, value, value_fed in fills:
        b = Builder("Fill", name)
        shp = np.array(dims, np.int64)
        s = b.input("shape", "i64", shp.shape, value=shp) if shape_fed else b.const("shape", shp)
        one = (1,) if name.endswith("_1d") else ()
        v = _words(odt, value).reshape(one)
        val = b.input("value", odt, one, value=v) if value_fed else b.const("value", v)
        out.append(b.case([s, val], [("y", odt, tuple(dims))], 0.0))
    expands: list[tuple[str, str, tuple[int, ...], list[int], bool]] = [
        ("const", "f32", (3, 1), [2, 3, 4], False), ("bidirectional_fed", "f32", (1, 4), [3, 1], True),
        ("same_rank", "i64", (2, 1, 5), [2, 6, 1], True), ("bool", "bool", (1, 3), [4, 3], False),
        ("keep_rank", "bf16", (2, 3), [1], False)]
    for name, dtype, xshape, dims, fed in expands:
        b = Builder("Expand", name)
        x = b.input("x", dtype, xshape, value=(b.rng.random(xshape) < 0.5) if dtype == "bool" else None)
        shp = np.array(dims, np.int64)
        s = b.input("shape", "i64", shp.shape, value=shp) if fed else b.const("shape", shp)
        out.append(b.case([x, s], [("y", dtype, np.broadcast_shapes(xshape, tuple(dims)))], 0.0))
    return out


__all__ = ["logic_ops", "math_ops", "reduce_ops", "shape_ops"]
