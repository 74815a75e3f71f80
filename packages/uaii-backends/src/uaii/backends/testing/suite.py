"""The case list of the conformance suite, family by family (see cases.py for the conventions)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from uaii.backends.testing.cases import F32, LOW, Q8_ACT, Builder, Case, binary_case, unary_case
from uaii.backends.testing.cases import matmul_nbits_cases as matmul_nbits
from uaii.backends.testing.cases import quantized_cases as quantized
from uaii.backends.testing.suite_onnx import logic_ops, math_ops, reduce_ops, shape_ops
from uaii.ir import DType

QTYPES = ("q8_0", "q4_0", "q4_k", "q6_k")


def elementwise() -> list[Case]:
    out = []
    for op in ("Neg", "Relu", "Silu", "Gelu", "Sigmoid", "Tanh", "Exp"):
        out += [unary_case(op, "decode", "f32", (1, 64)), unary_case(op, "prefill", "f32", (7, 33)),
                unary_case(op, "f16", "f16", (3, 16), tol=LOW)]
    out += [unary_case("Gelu", "tanh", "f32", (5, 32), approximate="tanh"),
            unary_case("Sqrt", "decode", "f32", (1, 64), low=0.0),
            unary_case("Sqrt", "prefill", "f32", (6, 20), low=0.0),
            unary_case("Softcap", "decode", "f32", (1, 64), cap=2.5),
            unary_case("Softcap", "prefill", "f32", (9, 40), low=-30.0, cap=30.0),
            unary_case("Neg", "i32", "i32", (4, 5)), unary_case("Relu", "i64", "i64", (4, 5)),
            unary_case("Relu", "bf16", "bf16", (4, 8), tol=LOW)]
    for op in ("Add", "Sub", "Mul", "Div"):
        out += [binary_case(op, "same", "f32", (1, 64), (1, 64)),
                binary_case(op, "broadcast", "f32", (5, 8), (8,)),
                binary_case(op, "i64", "i64", (3, 7), (3, 7)),
                binary_case(op, "f16", "f16", (4, 6), (1, 6), tol=LOW)]
    out.append(binary_case("Add", "weight", "f32", (6, 16), (16,), weight_b=True))
    out.append(binary_case("Mul", "bf16", "bf16", (3, 8), (3, 8), tol=LOW))
    out.append(binary_case("Mul", "bf16_weight", "bf16", (3, 8), (8,), tol=LOW, weight_b=True))
    return out


def cast() -> list[Case]:
    out = []
    for name, src, dst, tol in (("f32_f16", "f32", "f16", LOW), ("f16_f32", "f16", "f32", F32),
                                ("bf16_f32", "bf16", "f32", F32), ("f32_bf16", "f32", "bf16", LOW),
                                ("f32_i32", "f32", "i32", 0.0), ("i64_f32", "i64", "f32", F32),
                                ("i32_i64", "i32", "i64", 0.0)):
        b = Builder("Cast", name)
        x = b.input("x", src, (4, 10), low=-100.0, high=100.0)
        out.append(b.case([x], [("y", dst, (4, 10))], tol, to=dst))
    b = Builder("Cast", "q8_0_f32")
    w = b.weight("w", "q8_0", (4, 64))
    out.append(b.case([w], [("y", "f32", (4, 64))], F32, to="f32"))
    for name, src, dst in (("f32_u8", "f32", "u8"), ("f32_bool", "f32", "bool"), ("i64_bool", "i64", "bool")):
        b = Builder("Cast", name)
        x = b.input("x", src, (3, 7), low=-300.0, high=300.0)
        out.append(b.case([x], [("y", dst, (3, 7))], 0.0, to=dst))
    b = Builder("Cast", "q4_k_f16")
    w = b.weight("w", "q4_k", (2, 256))
    out.append(b.case([w], [("y", "f16", (2, 256))], F32, to="f16"))
    return out


def glu() -> list[Case]:
    out = []
    for op, attrs in (("SwiGLU", {}), ("GeGLU", {}), ("GeGLU", {"approximate": "tanh"})):
        tag = "_tanh" if attrs else ""
        for name, rows, d in (("decode", 1, 64), ("prefill", 9, 40)):
            b = Builder(op, name + tag)
            g, u = b.input("gate", "f32", (rows, d)), b.input("up", "f32", (rows, d))
            out.append(b.case([g, u], [("y", "f32", (rows, d))], params=attrs))
        b = Builder(op, "packed" + tag)
        p = b.input("gate_up", "f32", (4, 64))
        out.append(b.case([p], [("y", "f32", (4, 32))], params=attrs))
    b = Builder("SwiGLU", "f16")
    g, u = b.input("gate", "f16", (3, 16)), b.input("up", "f16", (3, 16))
    out.append(b.case([g, u], [("y", "f16", (3, 16))], LOW))
    return out


def matmul() -> list[Case]:
    out = []
    for op in ("MatMul", "MatMulRelu"):
        for rows in (1, 17):
            b = Builder(op, f"f32_m{rows}")
            a, w = b.input("a", "f32", (rows, 64)), b.weight("w", "f32", (48, 64))
            out.append(b.case([a, w], [("y", "f32", (rows, 48))], transpose_b=True))
    for qt in (*QTYPES, "f16"):
        for rows in (1, 5):
            b = Builder("MatMul", f"{qt}_m{rows}")
            a, w = b.input("a", "f32", (rows, 256)), b.weight("w", qt, (32, 256))
            out.append(b.case([a, w], [("y", "f32", (rows, 32))], Q8_ACT if qt != "f16" else 1e-3,
                              transpose_b=True))
    for qt in ("q4_1", "q5_0", "bf16"):
        b = Builder("MatMul", f"{qt}_m3")
        a, w = b.input("a", "f32", (3, 64)), b.weight("w", qt, (24, 64))
        out.append(b.case([a, w], [("y", "f32", (3, 24))], Q8_ACT if qt != "bf16" else 1e-3, transpose_b=True))
    b = Builder("MatMul", "kn_weight")
    a, w = b.input("a", "f32", (3, 16)), b.weight("w", "f32", (16, 24))
    out.append(b.case([a, w], [("y", "f32", (3, 24))]))
    b = Builder("MatMul", "batched_activations")
    a, c = b.input("a", "f32", (2, 3, 8)), b.input("b", "f32", (2, 8, 5))
    out.append(b.case([a, c], [("y", "f32", (2, 3, 5))]))
    b = Builder("MatMul", "3d_rows")
    a, w = b.input("a", "f32", (2, 3, 32)), b.weight("w", "q8_0", (16, 32))
    out.append(b.case([a, w], [("y", "f32", (2, 3, 16))], Q8_ACT, transpose_b=True))
    for name, attrs in (("plain", {}), ("trans", {"transA": True, "transB": True, "alpha": 0.5, "beta": 2.0})):
        b = Builder("Gemm", name)
        a = b.input("a", "f32", (8, 4) if attrs else (4, 8))
        w = b.weight("w", "f32", (6, 8) if attrs else (8, 6))
        c = b.input("c", "f32", (6,))
        out.append(b.case([a, w, c], [("y", "f32", (4, 6))], params=attrs))
    b = Builder("Gemm", "bf16_activations")  # B and C fed at run time as bf16 words, not weights
    a, w, c = b.input("a", "bf16", (4, 8)), b.input("b", "bf16", (8, 6)), b.input("c", "bf16", (6,))
    out.append(b.case([a, w, c], [("y", "bf16", (4, 6))], LOW))
    b = Builder("Gemm", "q8_0_bias")
    a, w, c = b.input("a", "f32", (3, 64)), b.weight("w", "q8_0", (16, 64)), b.input("c", "f32", (3, 1))
    out.append(b.case([a, w, c], [("y", "f32", (3, 16))], Q8_ACT, transB=True, alpha=0.5, beta=2.0))
    for qt in ("f32", "q8_0"):
        for rows in (1, 6):
            b = Builder("GroupedMatMul", f"{qt}_m{rows}")
            a = b.input("a", "f32", (rows, 64))
            ws = [b.weight(f"w{i}", qt, (n, 64)) for i, n in enumerate((32, 16, 16))]
            outs = [(f"y{i}", "f32", (rows, n)) for i, n in enumerate((32, 16, 16))]
            out.append(b.case([a, *ws], outs, Q8_ACT if qt != "f32" else F32, transpose_b=True))
    return out


def norms() -> list[Case]:
    out = []
    for name, shape, unit in (("decode", (1, 64), False), ("prefill", (9, 64), True), ("heads", (5, 4, 16), False)):
        b = Builder("RMSNorm", name)
        x, w = b.input("x", "f32", shape), b.weight("w", "f32", shape[-1:])
        out.append(b.case([x, w], [("y", "f32", shape)], eps=1e-5, add_unit_offset=unit))
    b = Builder("RMSNorm", "f16")
    x, w = b.input("x", "f16", (3, 32)), b.weight("w", "f32", (32,))
    out.append(b.case([x, w], [("y", "f16", (3, 32))], LOW))
    b = Builder("RMSNorm", "bf16_weight")  # a bf16 checkpoint's norm weight, with bf16 activations
    x, w = b.input("x", "bf16", (3, 32)), b.weight("w", "bf16", (32,))
    out.append(b.case([x, w], [("y", "bf16", (3, 32))], LOW))
    for name, shape, sum_out in (("decode", (1, 64), True), ("prefill", (7, 64), True), ("no_sum", (4, 32), False)):
        b = Builder("AddRMSNorm", name)
        a, c, w = b.input("a", "f32", shape), b.input("b", "f32", shape), b.weight("w", "f32", shape[-1:])
        outs = [("y", "f32", shape), ("sum" if sum_out else "", "f32", shape)]
        out.append(b.case([a, c, w], outs, eps=1e-6, add_unit_offset=name == "prefill"))
    for name, shape, axis, bias in (("decode", (1, 64), -1, True), ("prefill", (9, 32), -1, False),
                                    ("two_axes", (3, 4, 8), -2, True)):
        b = Builder("LayerNorm", name)
        x = b.input("x", "f32", shape)
        ps = [b.weight("w", "f32", shape[axis:])] + ([b.weight("bias", "f32", shape[axis:])] if bias else [])
        out.append(b.case([x, *ps], [("y", "f32", shape)], eps=1e-5, axis=axis))
    b = Builder("LayerNorm", "bf16_weight")
    x = b.input("x", "bf16", (4, 16))
    ps = [b.weight("w", "bf16", (16,)), b.weight("bias", "bf16", (16,))]
    out.append(b.case([x, *ps], [("y", "bf16", (4, 16))], LOW, eps=1e-5, axis=-1))
    for name, shape, axis in (("decode", (1, 64), -1), ("prefill", (6, 50), -1), ("axis0", (5, 7), 0)):
        b = Builder("Softmax", name)
        x = b.input("x", "f32", shape, low=-8.0, high=8.0)
        out.append(b.case([x], [("y", "f32", shape)], axis=axis))
    return out


def reductions() -> list[Case]:
    out = []
    for name, largest, dtype in (("largest", True, "f32"), ("smallest", False, "f32"), ("i64", True, "i64")):
        b = Builder("TopK", name)
        x = b.input("x", dtype, (4, 10))
        out.append(b.case([x], [("values", dtype, (4, 3)), ("indices", "i64", (4, 3))], 0.0, k=3, largest=largest))
    b = Builder("TopK", "axis0")
    x = b.input("x", "f32", (6, 3))
    out.append(b.case([x], [("values", "f32", (2, 3)), ("indices", "i64", (2, 3))], 0.0, k=2, axis=0))
    for name, keep, axis in (("keepdims", True, -1), ("flat", False, 0)):
        b = Builder("ArgMax", name)
        x = b.input("x", "f32", (5, 9))
        shape = ((5, 1) if keep else (5,)) if axis == -1 else ((1, 9) if keep else (9,))
        out.append(b.case([x], [("y", "i64", shape)], 0.0, axis=axis, keepdims=keep))
    means: list[tuple[str, str, tuple[int, ...], dict[str, object], tuple[int, ...], float]] = [
        ("decode", "f32", (1, 64), dict(axes=(-1,)), (1, 1), F32),
        ("pool_tokens", "f32", (9, 40), dict(axes=(0,)), (1, 40), F32),
        ("middle_dropped", "f32", (3, 5, 4), dict(axes=(1,), keepdims=False), (3, 4), F32),
        ("all_axes", "f32", (4, 6), dict(keepdims=False), (), F32),
        ("f16", "f16", (6, 16), dict(axes=(-2,)), (1, 16), LOW),
        ("bf16", "bf16", (5, 8), dict(axes=(1,)), (5, 1), LOW)]
    for name, dtype, xshape, attrs, yshape, tol in means:
        b = Builder("ReduceMean", name)
        x = b.input("x", dtype, xshape)
        out.append(b.case([x], [("y", dtype, yshape)], tol, params=attrs))
    return out


def movement() -> list[Case]:
    out = []
    b = Builder("Identity", "f32")
    out.append(b.case([b.input("x", "f32", (3, 5))], [("y", "f32", (3, 5))], 0.0))
    b = Builder("Identity", "q8_0_weight")
    out.append(b.case([b.weight("w", "q8_0", (2, 32))], [("y", "q8_0", (2, 32))], 0.0))
    b = Builder("Reshape", "heads")
    out.append(b.case([b.input("x", "f32", (4, 24))], [("y", "f32", (4, 3, 8))], 0.0, shape=(0, 3, 8)))
    b = Builder("Reshape", "infer")
    out.append(b.case([b.input("x", "i64", (2, 3, 4))], [("y", "i64", (6, 4))], 0.0, shape=(-1, 4)))
    b = Builder("Reshape", "shape_input")
    x = b.input("x", "f32", (2, 6))
    s = b.const("s", np.array([3, 4], np.int64))
    out.append(b.case([x, s], [("y", "f32", (3, 4))], 0.0))
    for name, shape, perm, oshape in (("2d", (4, 6), (1, 0), (6, 4)), ("3d", (2, 3, 4), (1, 0, 2), (3, 2, 4)),
                                      ("unit_axis", (4, 1, 6), (1, 0, 2), (1, 4, 6))):
        b = Builder("Transpose", name)
        out.append(b.case([b.input("x", "f32", shape)], [("y", "f32", oshape)], 0.0, perm=perm))
    for name, axis, shapes, oshape in (("rows", 0, ((2, 4), (3, 4)), (5, 4)), ("cols", -1, ((3, 2), (3, 5)), (3, 7))):
        b = Builder("Concat", name)
        ins = [b.input(f"x{i}", "f32", s) for i, s in enumerate(shapes)]
        out.append(b.case(ins, [("y", "f32", oshape)], 0.0, axis=axis))
    b = Builder("Concat", "q8_0_rows")
    ins = [b.weight(f"w{i}", "q8_0", (r, 32)) for i, r in enumerate((2, 3))]
    out.append(b.case(ins, [("y", "q8_0", (5, 32))], 0.0, axis=0))
    for name, axis, sizes, shape in (("cols", -1, (3, 5), (4, 8)), ("rows", 0, (1, 3), (4, 6))):
        b = Builder("Split", name)
        x = b.input("x", "f32", shape)
        outs = [(f"y{i}", "f32", tuple(s if d == axis % 2 else shape[d] for d in range(2)))
                for i, s in enumerate(sizes)]
        out.append(b.case([x], outs, 0.0, axis=axis, split=sizes))
    for name, shape, attrs, oshape in (
            ("last_row", (6, 8), dict(starts=(-1,), ends=(1 << 31,), axes=(0,)), (1, 8)),
            ("inner", (4, 10), dict(starts=(2,), ends=(7,), axes=(1,)), (4, 5)),
            ("reverse", (5, 3), dict(starts=(4,), ends=(-(1 << 31),), axes=(0,), steps=(-2,)), (3, 3))):
        b = Builder("Slice", name)
        out.append(b.case([b.input("x", "f32", shape)], [("y", "f32", oshape)], 0.0, params=attrs))
    return out


def indexing() -> list[Case]:
    out = []
    for name, dt, rows in (("f32", "f32", 1), ("q8_0", "q8_0", 5), ("q4_k", "q4_k", 3), ("f16", "f16", 4),
                           ("q4_0", "q4_0", 2), ("q6_k", "q6_k", 3), ("bf16", "bf16", 2)):
        b = Builder("Embedding", name)
        ids = b.input("ids", "i64", (rows,), value=b.rng.integers(0, 16, size=rows).astype(np.int64))
        t = b.weight("table", dt, (16, 256))
        odt = "f32" if DType.parse(dt).is_quantized else dt
        out.append(b.case([ids, t], [("y", odt, (rows, 256))], F32))
    for name, axis, shape, idx, oshape in (("rows", 0, (6, 4), [[0, -1], [2, 3]], (2, 2, 4)),
                                           ("cols", 1, (3, 5), [4, 0, 1], (3, 3))):
        b = Builder("Gather", name)
        x = b.input("x", "f32", shape)
        i = b.input("i", "i64", (np.asarray(idx).shape), value=np.asarray(idx, np.int64))
        out.append(b.case([x, i], [("y", "f32", oshape)], 0.0, axis=axis))
    for name, dt, odt in (("q4_0_rows", "q4_0", "q4_0"), ("f16_weight_rows", "f16", "f16")):
        b = Builder("Gather", name)
        x = b.weight("x", dt, (6, 32))
        i = b.input("i", "i64", (2, 2), value=np.array([[1, -1], [0, 2]], np.int64))
        out.append(b.case([x, i], [("y", odt, (2, 2, 32))], 0.0, axis=0))
    return out


def rope() -> list[Case]:
    out = []
    specs: list[tuple[str, dict[str, object], bool]] = [
        ("normal_decode", dict(mode="normal"), False), ("neox_prefill", dict(mode="neox"), False),
        ("partial", dict(mode="neox", rotary_dims=8), False),
        ("llama3", dict(mode="normal", scaling_type="llama3", factor=8.0, original_max_position=64,
                        low_freq_factor=1.0, high_freq_factor=4.0, theta=500000.0), False),
        ("yarn", dict(mode="neox", scaling_type="yarn", factor=4.0, original_max_position=32, attn_factor=1.1), False),
        ("linear", dict(mode="normal", scaling_type="linear", factor=2.0), False),
        ("freq_factors", dict(mode="normal"), True)]
    for name, attrs, ff in specs:
        t = 1 if "decode" in name else 6
        b = Builder("RoPE", name)
        x = b.input("x", "f32", (t, 3, 16))
        pos = b.input("pos", "i64", (t,), value=(b.rng.integers(0, 50) + np.arange(t)).astype(np.int64))
        ins = [x, pos]
        if ff:
            rot = 16
            ins.append(b.weight("ff", "f32", (rot // 2,), low=1.0, high=4.0))
        out.append(b.case(ins, [("y", "f32", (t, 3, 16))], 1e-4, params=attrs))
    b = Builder("RoPE", "batched_positions")  # [batch, seq] positions over [batch, seq, heads, dim]
    x = b.input("x", "f32", (2, 4, 3, 16))
    pos = b.input("pos", "i64", (2, 4), value=b.rng.integers(0, 5000, size=(2, 4)).astype(np.int64))
    out.append(b.case([x, pos], [("y", "f32", (2, 4, 3, 16))], 1e-4, mode="neox", rotary_dims=12))
    return out


def attention() -> list[Case]:
    out = []
    for name, t, past, hq, hkv, attrs in (
            ("prefill", 7, 0, 4, 2, {}), ("decode_past", 1, 9, 4, 1, {}), ("chunk_past", 3, 5, 2, 2, {}),
            ("window_sinks", 8, 4, 2, 1, dict(sliding_window=3, sinks=2)), ("softcap", 5, 0, 2, 2, dict(softcap=5.0)),
            ("noncausal", 6, 0, 2, 1, dict(causal=False)), ("scale", 4, 2, 2, 2, dict(scale=0.3)),
            ("noncausal_window", 3, 0, 2, 1, dict(causal=False, sliding_window=2))):
        b = Builder("Attention", name)
        q = b.input("q", "f32", (t, hq, 16))
        k, v = b.input("k", "f32", (t, hkv, 16)), b.input("v", "f32", (t, hkv, 8))
        ins, outs = [q, k, v], [("y", "f32", (t, hq, 8))]
        if past:
            ins += [b.input("past_k", "f32", (past, hkv, 16)), b.input("past_v", "f32", (past, hkv, 8))]
            outs += [("present_k", "f32", (past + t, hkv, 16)), ("present_v", "f32", (past + t, hkv, 8))]
        out.append(b.case(ins, outs, 1e-4, n_heads=hq, n_kv_heads=hkv, **attrs))
    for name, mdt in (("bool_mask", "bool"), ("additive_mask", "f32")):
        b = Builder("Attention", name)
        q, k, v = (b.input(n, "f32", (4, 2, 8)) for n in "qkv")
        m = b.rng.random((2, 4, 4)) > 0.3 if mdt == "bool" else b.rng.normal(size=(2, 4, 4)).astype(np.float32)
        mask = b.input("mask", mdt, (2, 4, 4), value=m)
        out.append(b.case([q, k, v, "", "", mask], [("y", "f32", (4, 2, 8))], 1e-4, causal=False))
    b = Builder("Attention", "batched_mask")  # leading batch dims, a mask broadcast over them and the queries
    q = b.input("q", "f32", (2, 3, 4, 8))
    k, v = b.input("k", "f32", (2, 3, 2, 8)), b.input("v", "f32", (2, 3, 2, 8))
    pk, pv = b.input("past_k", "f32", (2, 2, 2, 8)), b.input("past_v", "f32", (2, 2, 2, 8))
    mask = b.input("mask", "bool", (4, 1, 5), value=b.rng.random((4, 1, 5)) > 0.3)
    out.append(b.case([q, k, v, pk, pv, mask], [("y", "f32", (2, 3, 4, 8)), ("present_k", "f32", (2, 5, 2, 8)),
                                                ("present_v", "f32", (2, 5, 2, 8))], 1e-4, n_heads=4, n_kv_heads=2))
    b = Builder("Attention", "long_past")  # a decode step over more keys than one workgroup's chunk
    q, k, v = b.input("q", "f32", (1, 4, 16)), b.input("k", "f32", (1, 2, 16)), b.input("v", "f32", (1, 2, 16))
    pk, pv = b.input("past_k", "f32", (300, 2, 16)), b.input("past_v", "f32", (300, 2, 16))
    out.append(b.case([q, k, v, pk, pv], [("y", "f32", (1, 4, 16))], 1e-4, n_heads=4, n_kv_heads=2,
                      sliding_window=200, sinks=3, softcap=20.0))
    out.append(_cached_attention())
    return out


def _cached_attention() -> Case:
    """The KV-state path: a prefill chunk then decode steps, fed one after another through the backend's state."""
    b = Builder("Attention", "kv_state")
    h, hq, d = 2, 4, 16
    q, k, v = (b.input(n, "f32", (5, hq if n == "q" else h, d), decl=("seq", hq if n == "q" else h, d))
               for n in "qkv")
    pk = b.input("past_k", "f32", (0, h, d), decl=("past", h, d))
    pv = b.input("past_v", "f32", (0, h, d), decl=("past", h, d))
    case = b.case([q, k, v, pk, pv], [("y", "f32", ("seq", hq, d)), ("present_k", "f32", ("past_plus_seq", h, d)),
                                      ("present_v", "f32", ("past_plus_seq", h, d))], 1e-4,
                  n_heads=hq, n_kv_heads=h, sliding_window=4)
    seq = []
    for t in (5, 1, 1, 3):
        seq.append({n: b.rng.uniform(-2, 2, size=(t, hq if n == "q" else h, d)).astype(np.float32) for n in "qkv"})
    return Case(case.op, case.name, case.graph, seq[0], tol=case.tol, feeds_seq=tuple(seq))


def moe() -> list[Case]:
    out = []
    for name, scoring, normalize, rows in (("softmax", "softmax", True, 1), ("sigmoid", "sigmoid", False, 6)):
        b = Builder("MoERouter", name)
        x = b.input("logits", "f32", (rows, 8))
        out.append(b.case([x], [("w", "f32", (rows, 2)), ("i", "i64", (rows, 2))], F32, n_experts=8, top_k=2,
                          normalize=normalize, scoring=scoring))
    for op, qt, rows, act in (("MoEExperts", "f32", 1, "silu"), ("MoEExperts", "q8_0", 5, "gelu"),
                              ("MoEExpertsSwiGLU", "q4_0", 4, "silu")):
        b = Builder(op, f"{qt}_{rows}")
        x = b.input("x", "f32", (rows, 64))
        w = b.input("w", "f32", (rows, 2), low=0.1, high=1.0)
        idx = b.input("i", "i64", (rows, 2), value=b.rng.integers(0, 4, size=(rows, 2)).astype(np.int64))
        banks = [b.weight(n, qt, s) for n, s in (("gate", (4, 32, 64)), ("up", (4, 32, 64)), ("down", (4, 64, 32)))]
        attrs: dict[str, object] = {"n_experts": 4, "top_k": 2}
        if op == "MoEExperts":
            attrs["activation"] = act
        out.append(b.case([x, w, idx, *banks], [("y", "f32", (rows, 64))], Q8_ACT if qt != "f32" else 1e-4,
                          params=attrs))
    return out


FAMILIES: tuple[Callable[[], list[Case]], ...] = (elementwise, cast, glu, matmul, norms, reductions, movement,
                                                  indexing, rope, attention, moe, math_ops, logic_ops, reduce_ops,
                                                  shape_ops, matmul_nbits, quantized)


def all_cases() -> list[Case]:
    return [c for family in FAMILIES for c in family()]


__all__ = ["FAMILIES", "all_cases"]
