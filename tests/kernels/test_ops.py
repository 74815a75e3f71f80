"""Operators against their NumPy references (uaii.kernels.reference), on every ISA, with the stated tolerances;
the SIMD builds of the row kernels must agree with the scalar build bit for bit."""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import uaii.kernels as K
from uaii.kernels import reference as R

# tolerances (also in docs/kernels.md)
NORM = {"rtol": 1e-5, "atol": 1e-6}
ACT = {"rtol": 1e-5, "atol": 2e-6}
ROPE = {"rtol": 1e-5, "atol": 1e-5}
ATTN = {"rtol": 1e-4, "atol": 1e-5}


def test_rms_norm(isa: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((7, 576)).astype(np.float32) * 3
    w = rng.standard_normal(576).astype(np.float32)
    np.testing.assert_allclose(K.rms_norm(x, w, 1e-5), R.rms_norm(x, w, 1e-5), **NORM)
    np.testing.assert_allclose(K.rms_norm(x, w, 1e-6, add_one=True), R.rms_norm(x, w, 1e-6, add_one=True), **NORM)
    np.testing.assert_allclose(K.rms_norm(x[0]), R.rms_norm(x[0]), **NORM)
    y = x.copy()
    K.rms_norm(y, w, out=y)                                  # in place
    np.testing.assert_allclose(y, R.rms_norm(x, w), **NORM)


def test_layer_norm(isa: str, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((5, 768)) * 2 + 1.5).astype(np.float32)
    w, b = rng.standard_normal((2, 768)).astype(np.float32)
    np.testing.assert_allclose(K.layer_norm(x, w, b), R.layer_norm(x, w, b), **NORM)
    np.testing.assert_allclose(K.layer_norm(x), R.layer_norm(x), **NORM)


def test_softmax(isa: str, rng: np.random.Generator) -> None:
    x = (rng.standard_normal((6, 1000)) * 10).astype(np.float32)
    x[1, :500] = -np.inf
    x[2] = -np.inf
    np.testing.assert_allclose(K.softmax(x, 0.5), R.softmax(x, 0.5), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(K.softmax(x)[2], 0.0)


def test_activations(isa: str, rng: np.random.Generator) -> None:
    x = np.concatenate([rng.standard_normal(5000) * 4, [0.0, -0.0, 1e-8, -100.0, 100.0, 89.0, -89.0]])
    x = x.astype(np.float32)
    np.testing.assert_allclose(K.silu(x), R.silu(x), **ACT)
    np.testing.assert_allclose(K.gelu(x), R.gelu(x), **ACT)
    np.testing.assert_allclose(K.gelu(x, "tanh"), R.gelu(x, "tanh"), **ACT)


def test_glu_on_fused_views(isa: str, rng: np.random.Generator) -> None:
    fused = rng.standard_normal((4, 2 * 1536)).astype(np.float32)
    gate, up = fused[:, :1536], fused[:, 1536:]
    np.testing.assert_allclose(K.swiglu(gate, up), R.swiglu(gate, up), **ACT)
    np.testing.assert_allclose(K.geglu(gate, up), R.geglu(gate, up), **ACT)
    np.testing.assert_allclose(K.geglu(gate, up, "tanh"), R.geglu(gate, up, "tanh"), **ACT)
    out = np.empty((1, 1536), np.float32)
    K.swiglu(gate[:1], up[:1], out=out)
    np.testing.assert_allclose(out, R.swiglu(gate[:1], up[:1]), **ACT)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_rope(neox: bool, n_rot: int, isa: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((5, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 7, 100, 40000])
    inv = K.rope_inv_freq(n_rot, 10000.0)
    np.testing.assert_allclose(K.rope(x, pos, inv, neox=neox), R.rope(x, pos, inv, neox=neox), **ROPE)
    y = x.copy()
    K.rope(y, pos, inv, neox=neox, attn_factor=1.1, out=y)   # in place, with an attention factor
    np.testing.assert_allclose(y, R.rope(x, pos, inv, neox=neox, attn_factor=1.1), **ROPE)


def test_rope_remembered_angles_are_a_fresh_computation(rng: np.random.Generator) -> None:
    """uk_rope remembers the cos/sin of recent positions per thread (a decode step rotates the same positions in
    every layer): a call after others gives the bits of the first call of a fresh process, for the same position
    with other frequencies (also a table rewritten in place, at the same address), another attention factor or
    rotary width, and more positions than the cache holds."""
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    inv = K.rope_inv_freq(64, 10000.0)
    cases = [(np.array([5, 6, 7]), inv.copy(), 1.0), (np.array([5, 6, 7]), K.rope_inv_freq(64, 500000.0), 1.0),
             (np.array([5, 6, 7]), inv.copy(), 1.25), (np.array([7, 5, 9]), K.rope_inv_freq(32, 10000.0), 1.0)]
    code = ("import sys, numpy as np, uaii.kernels as K\n"
            "x, pos, inv, attn = np.load(sys.argv[1]), np.load(sys.argv[2]), np.load(sys.argv[3]), float(sys.argv[4])\n"
            "sys.stdout.buffer.write(K.rope(x, pos, inv, attn_factor=attn).tobytes())")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (pos, table, attn) in enumerate(cases):
            files = [Path(tmp, f"{i}_{n}.npy") for n in ("x", "pos", "inv")]
            for f, a in zip(files, (x, pos.astype(np.int32), table), strict=True):
                np.save(f, a)
            fresh = subprocess.run([sys.executable, "-c", code, *map(str, files), str(attn)], check=True,
                                   capture_output=True).stdout
            shared = inv  # one address, rewritten in place: a cache keyed by the pointer would hand back stale angles
            if table.size == inv.size:
                shared[:] = table
            got = K.rope(x, pos, shared if table.size == inv.size else table, attn_factor=attn)
            assert got.tobytes() == fresh, f"case {i}"
        many = np.arange(40, dtype=np.int32)  # more positions than the cache's entries, twice
        y = rng.standard_normal((40, 2, 64)).astype(np.float32)
        first = K.rope(y, many, inv)
        np.testing.assert_array_equal(K.rope(y, many, inv), first)
        np.testing.assert_array_equal(K.rope(y[::-1].copy(), many[::-1].copy(), inv), first[::-1])


def test_rope_frequency_scaling() -> None:
    base = K.rope_inv_freq(64, 500000.0)
    np.testing.assert_allclose(K.rope_inv_freq(64, 500000.0, scaling="linear", factor=4), base / 4, rtol=1e-6)
    l3 = K.rope_inv_freq(64, 500000.0, scaling="llama3", factor=8, original_max_position=8192)
    assert l3[0] == base[0] and np.isclose(l3[-1], base[-1] / 8)          # high freqs kept, low ones scaled
    assert np.all((l3 <= base * (1 + 1e-6)) & (l3 >= base / 8 * (1 - 1e-6)))
    yarn = K.rope_inv_freq(64, 10000.0, scaling="yarn", factor=4, original_max_position=4096)
    assert yarn[0] == pytest.approx(K.rope_inv_freq(64, 10000.0)[0]) and yarn[-1] == pytest.approx(
        K.rope_inv_freq(64, 10000.0)[-1] / 4)
    assert K.yarn_attn_factor(4) == pytest.approx(0.1 * math.log(4) + 1)
    with pytest.raises(K.KernelError, match="unknown rope scaling"):
        K.rope_inv_freq(64, scaling="ntk", factor=2)


@pytest.mark.parametrize("case", ["prefill", "decode", "window_sinks", "softcap_sinklogits", "ring_f16"])
def test_attention(case: str, isa: str, rng: np.random.Generator) -> None:
    hq, hkv, d = 6, 2, 64
    s = 40
    kw: dict = {}
    k = rng.standard_normal((s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((s, hkv, d)).astype(np.float32)
    k_pos = np.arange(s)
    t = 9 if case in ("prefill", "window_sinks", "softcap_sinklogits") else 1
    q_pos = np.arange(s - t, s)
    if case == "window_sinks":
        kw = {"window": 8, "n_sink": 4}
    if case == "softcap_sinklogits":
        kw = {"softcap": 5.0, "sinks": rng.standard_normal(hq).astype(np.float32)}
    if case == "ring_f16":                       # a ring buffer view: positions out of order, empty slots, f16
        big = rng.standard_normal((s, 4, d)).astype(np.float16)
        k, v = big[:, 1:3, :], big[:, 2:4, :]                        # strided views
        k_pos = rng.permutation(s) + 100
        k_pos[[3, 11]] = -1
        q_pos = np.array([k_pos.max()])
        kw = {"window": 16, "n_sink": 2}
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    scale = 1 / math.sqrt(d)
    got = K.attention(q, k, v, q_pos=q_pos, k_pos=k_pos, **kw)
    want = R.attention(q, k, v, q_pos, k_pos, scale, **{a: b for a, b in kw.items()})
    np.testing.assert_allclose(got, want, **ATTN)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("d", [64, 36, 256])
def test_attention_simd_is_bit_identical_to_scalar(dtype: type, d: int, isa: str, rng: np.random.Generator) -> None:
    """The x86 attention row kernels (x86_ops.inc) keep ops_impl.inc's operation order: same bits as scalar, on
    head sizes with and without a tail past the last 8 values, f32 and f16 caches, strided (GQA) rows."""
    hq, hkv, s = 6, 2, 33
    big = rng.standard_normal((s, 2 * hkv, d)).astype(dtype)
    k, v = big[:, :hkv, :], big[:, hkv:, :]
    q = rng.standard_normal((3, hq, d)).astype(np.float32)
    with K.use_isa("scalar"):
        want = K.attention(q, k, v, window=12, n_sink=2)
    np.testing.assert_array_equal(K.attention(q, k, v, window=12, n_sink=2), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("hq", "hkv", "d", "dv", "s", "t"), [(9, 3, 64, 64, 37, 2), (10, 2, 36, 20, 30, 2),
                                                               (8, 1, 20, 9, 9, 2), (4, 4, 64, 48, 3, 2),
                                                               (4, 1, 64, 64, 300, 1)])
def test_attention_gqa_heads_are_each_head_alone(dtype: type, hq: int, hkv: int, d: int, dv: int, s: int, t: int,
                                                 isa: str, rng: np.random.Generator) -> None:
    """The kernels score and sum the G query heads of one kv head together (each cache row read once for all G,
    keys 4 at a time, heads 4 at a time, interleaved softmax chains): every head's bits must still be those of that
    head alone — the same call with the kv heads repeated (G = 1) — and the scalar build's, with key counts and
    head sizes off the blocks (tails), G over 4, sinks and soft-capping, and one kv head with enough work to wake
    threads for one query (its G heads are then split into slices, one per thread)."""
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((s, hkv, d)).astype(dtype)
    v = rng.standard_normal((s, hkv, dv)).astype(dtype)
    kw = {"window": 12, "n_sink": 2, "softcap": 4.0, "sinks": rng.standard_normal(hq).astype(np.float32)}
    got = K.attention(q, k, v, **kw)
    g = hq // hkv
    np.testing.assert_array_equal(got, K.attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), **kw))
    with K.use_isa("scalar"):
        np.testing.assert_array_equal(got, K.attention(q, k, v, **kw))


def test_attention_defaults_and_empty(rng: np.random.Generator) -> None:
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    k = rng.standard_normal((5, 4, 16)).astype(np.float32)
    v = rng.standard_normal((5, 4, 8)).astype(np.float32)
    got = K.attention(q, k, v)                                           # queries are the last 3 of 5 keys
    np.testing.assert_allclose(got, R.attention(q, k, v, np.arange(2, 5), np.arange(5), 0.25), **ATTN)
    none = K.attention(q, k, v, q_pos=np.array([0, 0, 0]), k_pos=np.array([-1, -1, 5, 6, 7]))
    np.testing.assert_array_equal(none, 0.0)                             # nothing visible: zeros
    with pytest.raises(K.KernelError, match="multiple"):
        K.attention(q, k[:, :3], v[:, :3])


def test_simd_row_kernels_bit_identical(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 1000)).astype(np.float32)
    w = rng.standard_normal(1000).astype(np.float32)

    def run() -> list[np.ndarray]:
        return [K.rms_norm(x, w), K.softmax(x), K.silu(x), K.gelu(x), K.gelu(x, "tanh"), K.swiglu(x, x[::-1]),
                K.layer_norm(x, w, w)]

    with K.use_isa("scalar"):
        expected = run()
    for isa in K.available_isas()[1:]:
        with K.use_isa(isa):
            for got, want in zip(run(), expected, strict=True):
                np.testing.assert_array_equal(got, want)


def test_numpy_ops(rng: np.random.Generator) -> None:
    a = rng.standard_normal((4, 1, 8)).astype(np.float32)
    b = rng.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(K.add(a, b), R.add(a, b), rtol=1e-6)
    out = np.empty((4, 3, 8), np.float32)
    assert K.mul(a, b, out=out) is out
    np.testing.assert_allclose(out, R.mul(a, b), rtol=1e-6)
    logits = rng.standard_normal((5, 64)).astype(np.float32)
    logits[0, [3, 9]] = 10.0                                             # a tie: the lower index first
    vals, idx = K.topk(logits, 4)
    rv, ri = R.topk(logits, 4)
    np.testing.assert_array_equal(idx, ri)
    np.testing.assert_array_equal(vals, rv)
    assert list(idx[0, :2]) == [3, 9]
    np.testing.assert_array_equal(K.argmax(logits), R.argmax(logits))
    with pytest.raises(K.KernelError):
        K.topk(logits, 65)
