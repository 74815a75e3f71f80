"""The kernels of the packed weight layouts of other tools (kernels/packed.cu: ONNX's MatMulNBits, MLX's quantized
rows), launched as the executor launches them — through the CPU references, through the CUDA source built by the
host compiler (``compiled``: the warp kernels with a thread per CUDA thread), on a CUDA device where one exists
(``cuda``; skipped with "no CUDA device" elsewhere) — against uaii.ir's numpy dequantization of each layout.

What they hold: every layout (MLX affine at 1 to 8 bits with f32, f16 and bf16 scales, mxfp4, nvfp4, mxfp8;
MatMulNBits at 4 and 8 bits with packed, float and default zero points, rows padded to whole blocks, B as stored
bytes or fed one byte per word) gives the product of its dequantized weight, and MLX's values bit for bit in an
embedding's rows; a launch computes only what its grid covers; expert products read only the chosen experts of a
bank, a piece or a gathered buffer. Through the executor: the weight stays packed on the device (no f32 copy), and a
streamed packed weight — pieces of rows, the rows an embedding's ids select, the experts a router chose — gives the
resident result.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from uaii.backends.base import ArrayWeights
from uaii.backends.cuda import geometry
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.device import DeviceBuffer
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.sources import PACKED_MODES
from uaii.backends.testing import cases
from uaii.backends.webgpu.program import to_device
from uaii.ir import DType
from uaii.ir.reference import evaluate, nbits, quantized

Int, Long, Ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_uint64
NULL = Ptr(0)
SENTINEL = np.float32(-7.25)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20260107)


@pytest.fixture
def dev(cuda_dev: Any) -> Any:
    """conftest's cuda_dev: the host model (references, or the kernels' CUDA source) and a device where there is one."""
    return cuda_dev


# ------------------------------------------------------------------------------------------ layouts
@dataclass(frozen=True)
class Layout:
    """A packed layout to test: MLX's ``mode`` (or "nbits": MatMulNBits), bits, group size, the scales' type, the
    zero points' ("" none, "u8" packed, a float type), ``k`` values per row and the stored bytes' stride."""

    mode: str
    bits: int
    group: int
    scales: str
    k: int
    zp: str = ""
    stride: int = 1

    @property
    def id(self) -> str:
        zp, fed = f"_zp_{self.zp}" if self.zp else "", "_fed" if self.stride == 4 else ""
        return f"{self.mode}_{self.bits}b_g{self.group}_{self.scales}{zp}_k{self.k}{fed}"

    @property
    def code(self) -> int:
        if self.mode == "affine":
            return PACKED_MODES[f"affine_{self.scales}"]
        if self.mode == "nbits":
            return PACKED_MODES["nbits_float_zp" if self.zp not in ("", "u8") else "nbits"]
        return PACKED_MODES[self.mode]


LAYOUTS = [
    *(Layout("affine", bits, 32, sdt, 96) for bits, sdt in ((1, "f16"), (2, "bf16"), (3, "f32"), (5, "f16"),
                                                            (6, "bf16"))),
    Layout("affine", 4, 64, "f16", 256), Layout("affine", 8, 128, "bf16", 256), Layout("affine", 4, 32, "f32", 64),
    Layout("mxfp4", 4, 32, "u8", 128), Layout("nvfp4", 4, 16, "u8", 48), Layout("mxfp8", 8, 32, "u8", 64),
    Layout("nbits", 4, 32, "f32", 100, "u8"), Layout("nbits", 4, 16, "bf16", 200, "u8", stride=4),
    Layout("nbits", 8, 64, "f16", 130), Layout("nbits", 4, 128, "f32", 300, "f16"),
    Layout("nbits", 8, 16, "f32", 40, "f32", stride=4),
    # rows past one step of pk_gemv's shared activation tile (32 units), the last one partial
    Layout("affine", 4, 64, "f16", 1600), Layout("nbits", 4, 32, "f32", 1100, "u8"),
]
MLX = [lay for lay in LAYOUTS if lay.mode != "nbits"]
BANKS = [lay for lay in LAYOUTS
         if (lay.mode, lay.bits, lay.stride) in (("affine", 2, 1), ("mxfp4", 4, 1), ("mxfp8", 8, 1), ("nbits", 4, 4))]


def _typed(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """Random values of a float type (bf16 as raw uint16 words, the IR's convention)."""
    x = rng.uniform(low, high, shape).astype(np.float32)
    if dtype == "bf16":
        from uaii.ir.reference._common import f32_to_bf16

        return f32_to_bf16(x)
    return x.astype(np.float16 if dtype == "f16" else np.float32)


@dataclass
class Weight:
    """A random packed weight of ``rows`` rows: its device forms (the packed bytes at the layout's stride, scale
    and offset words) and its values as uaii.ir dequantizes them, float64 [rows, k]."""

    packed: np.ndarray
    scales: np.ndarray
    offs: np.ndarray | None
    dense: np.ndarray


def make(lay: Layout, rows: int, rng: np.random.Generator) -> Weight:
    if lay.mode == "nbits":
        kb, blob = -(-lay.k // lay.group), lay.group * lay.bits // 8
        b = rng.integers(0, 256, (rows, kb, blob)).astype(np.uint8)
        scales = _typed(rng, lay.scales, (rows, kb), 0.01, 0.05)
        zp: np.ndarray | None = None
        if lay.zp == "u8":
            zp = rng.integers(0, 256, rows * -(-kb * lay.bits // 8)).astype(np.uint8)
        elif lay.zp:
            zp = _typed(rng, lay.zp, (rows, kb), 0, 2 ** lay.bits - 1)
        dense = nbits.dequantize(b, scales, zp, K=lay.k, N=rows, bits=lay.bits, block_size=lay.group)
        packed = b.reshape(-1) if lay.stride == 1 else to_device(b, DType.U8).view(np.uint8)
        offs = None if zp is None else to_device(zp, DType.parse(lay.zp))
        return Weight(packed, to_device(scales, DType.parse(lay.scales)), offs, dense)
    groups, words = lay.k // lay.group, lay.k * lay.bits // 32
    if lay.mode == "mxfp8":
        codes = rng.integers(0, 256, (rows, lay.k)).astype(np.uint8)
        codes[(codes & 0x7F) == 0x7F] -= 1                     # no E4M3 NaN
        w = codes.view("<u4")
    else:
        w = rng.integers(0, 2 ** 32, (rows, words), dtype=np.uint32)
    if lay.mode == "affine":
        span = 2.0 / (2 ** lay.bits - 1)
        s, bias = (_typed(rng, lay.scales, (rows, groups), lo, hi) for lo, hi in ((-span, span), (-1.0, 1.0)))
        dense = quantized.dequantize(w, s, bias, mode="affine", bits=lay.bits, group_size=lay.group, k=lay.k)
        dt = DType.parse(lay.scales)
        return Weight(w.view(np.uint8).reshape(-1), to_device(s, dt), to_device(bias, dt), dense.astype(np.float64))
    lo, hi = (120, 131) if lay.mode.startswith("mx") else (0x30, 0x48)
    codes = rng.integers(lo, hi, (rows, groups)).astype(np.uint8)
    if lay.mode == "nvfp4":
        codes |= (rng.integers(0, 2, (rows, groups)) << 7).astype(np.uint8)
    dense = quantized.dequantize(w, codes, None, mode=lay.mode, bits=lay.bits, group_size=lay.group, k=lay.k)
    return Weight(w.view(np.uint8).reshape(-1), to_device(codes, DType.U8), None, dense.astype(np.float64))


def _layout_args(dev: Any, lay: Layout, wt: Weight) -> tuple[Any, ...]:
    """(stride, k, bits, group, mode, scales, offsets) as every packed.cu kernel takes them."""
    offs = dev.upload(wt.offs) if wt.offs is not None else NULL
    return (Int(lay.stride), Int(lay.k), Int(lay.bits), Int(lay.group), Int(lay.code), dev.upload(wt.scales), offs)


def _filled(dev: Any, count: int) -> DeviceBuffer:
    return dev.upload(np.full(count, SENTINEL, np.float32))


def _close(got: np.ndarray, want: np.ndarray) -> None:
    """Within float32 accumulation of the product: the normalized error of the conformance suite's F32."""
    assert np.abs(got - want).max() <= 2e-5 * max(float(np.abs(want).max()), 1e-6)


# ------------------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: lay.id)
def test_products_of_every_layout_against_the_irs_dequantization(lay: Layout, dev: Any,
                                                                 rng: np.random.Generator) -> None:
    """pk_gemv for one row and for 11 (two blocks of activation rows, the second partial), x and y strided, the
    gaps between y's rows untouched."""
    n = 37
    wt = make(lay, n, rng)
    dw = dev.upload(wt.packed)
    for m in (1, 11):
        ldx, ldy = lay.k + 3, n + 5
        x = rng.standard_normal((m, lay.k)).astype(np.float32)
        xbuf = np.zeros((m - 1) * ldx + lay.k, np.float32)
        for i in range(m):
            xbuf[i * ldx:i * ldx + lay.k] = x[i]
        dy = _filled(dev, (m - 1) * ldy + n)
        dev.launch("packed", "pk_gemv", geometry.packed_gemv(n, m), dw, Int(n), *_layout_args(dev, lay, wt),
                   dev.upload(xbuf), Long(ldx), Int(m), dy, Long(ldy))
        y = dev.download(dy, ((m - 1) * ldy + n,), np.float32)
        _close(np.stack([y[i * ldy:i * ldy + n] for i in range(m)]), x.astype(np.float64) @ wt.dense.T)
        assert all((y[i * ldy + n:(i + 1) * ldy] == SENTINEL).all() for i in range(m - 1))


@pytest.mark.parametrize("lay", MLX, ids=lambda lay: lay.id)
def test_rows_are_mlxs_values_bit_for_bit(lay: Layout, dev: Any, rng: np.random.Generator) -> None:
    """pk_rows over the whole table (repeated ids), over a piece of rows [4, 9) that writes only its ids' rows, and
    over rows gathered for the ids (row i of the buffer, the scales of the id's row)."""
    vocab = 12
    wt = make(lay, vocab, rng)
    ids = np.array([5, 0, 11, 5, 8, 3], np.int32)
    want = wt.dense[ids].astype(np.float32)
    r, units = ids.size, -(-lay.k // 32)
    at = geometry.elementwise(r * units)
    args, di = _layout_args(dev, lay, wt), dev.upload(ids)
    fault = dev.upload(np.zeros(1, np.int32))
    row_bytes = lay.k * lay.bits // 8
    for w, widx, w0, w1 in (
            (dev.upload(wt.packed), di, 0, vocab),
            (dev.upload(wt.packed[4 * row_bytes:9 * row_bytes]), di, 4, 9),
            (dev.upload(wt.packed.reshape(vocab, row_bytes)[ids]), dev.upload(np.arange(r, dtype=np.int32)), 0, r)):
        dy = _filled(dev, r * lay.k)
        dev.launch("packed", "pk_rows", at, w, *args, widx, Int(w0), Int(w1), di, Int(r), dy, Int(vocab), fault, Int(3))
        got = dev.download(dy, (r, lay.k), np.float32)
        mine = (ids >= w0) & (ids < w1) if w1 != r else np.ones(r, bool)
        assert np.array_equal(got[mine].view(np.uint32), want[mine].view(np.uint32))
        assert (got[~mine] == SENTINEL).all()
    assert dev.download(fault, (1,), np.int32)[0] == 0
    bad = dev.upload(np.array([0, vocab, -1, 1] + [2] * (r - 4), np.int32))  # ids outside the table: zeros, a fault
    dy = _filled(dev, r * lay.k)
    dev.launch("packed", "pk_rows", at, dev.upload(wt.packed), *args, bad, Int(0), Int(vocab), bad, Int(r), dy,
               Int(vocab), fault, Int(3))
    got = dev.download(dy, (r, lay.k), np.float32)
    assert dev.download(fault, (1,), np.int32)[0] == 3 and not got[1:3].any()
    assert np.array_equal(got[[0, 3]].view(np.uint32), wt.dense[[0, 1]].astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("lay", BANKS, ids=lambda lay: lay.id)
def test_expert_products_read_the_chosen_experts(lay: Layout, dev: Any, rng: np.random.Generator) -> None:
    """pk_gemv_idx over a bank of 5 experts for each (token, slot) pair (x_div = top_k): the whole bank; a piece of
    experts [2, 4), which computes only its pairs; and the chosen experts gathered into a buffer with the indices
    remapped into it (-1: not there), the scales still those of the router's expert."""
    experts, n, tokens, k = 5, 20, 3, 2
    wt = make(lay, experts * n, rng)
    dense = wt.dense.reshape(experts, n, lay.k)
    x = rng.standard_normal((tokens, lay.k)).astype(np.float32)
    idx = np.array([[3, 0], [2, 3], [4, 2]], np.int32)
    pairs = tokens * k
    want = np.stack([dense[idx[s // k, s % k]] @ x[s // k].astype(np.float64) for s in range(pairs)])
    per = n * lay.group * -(-lay.k // lay.group) * lay.bits // 8 * lay.stride  # device bytes of one expert
    args, dx, didx = _layout_args(dev, lay, wt), dev.upload(x), dev.upload(idx)
    remap = np.where(np.isin(idx, [0, 4]), np.where(idx == 0, 0, 1), -1).astype(np.int32)
    gathered = np.concatenate([wt.packed[0:per], wt.packed[4 * per:5 * per]])
    for bank, ix, e0, e1, mine in (
            (wt.packed, didx, 0, experts, np.ones(pairs, bool)),
            (wt.packed[2 * per:4 * per], didx, 2, 4, np.isin(idx.reshape(-1), [2, 3])),
            (gathered, dev.upload(remap), 0, 2, np.isin(idx.reshape(-1), [0, 4]))):
        dy = _filled(dev, pairs * n)
        dev.launch("packed", "pk_gemv_idx", geometry.gemv_pairs(n, pairs), dev.upload(bank), Int(n), *args, dx,
                   Long(lay.k), Int(k), ix, Int(e0), Int(e1), didx, dy, Long(n))
        got = dev.download(dy, (pairs, n), np.float32)
        _close(got[mine], want[mine])
        assert (got[~mine] == SENTINEL).all()


def test_a_grid_too_small_leaves_the_rest_untouched(dev: Any, rng: np.random.Generator) -> None:
    """pk_gemv on 2 x 1 blocks of 10 weight rows and 11 activation rows: rows 0..7 of activation rows 0..7; pk_rows
    with 5 of 2 x 4 units: the first id's row and a unit of the second."""
    lay = Layout("mxfp4", 4, 32, "u8", 128)
    n, m = 10, 11
    wt = make(lay, n, rng)
    x = rng.standard_normal((m, lay.k)).astype(np.float32)
    dy = _filled(dev, m * n)
    dev.launch("packed", "pk_gemv", Launch((2, 1, 1), (32, 4, 1)), dev.upload(wt.packed), Int(n),
               *_layout_args(dev, lay, wt), dev.upload(x), Long(lay.k), Int(m), dy, Long(n))
    y = dev.download(dy, (m, n), np.float32)
    _close(y[:8, :8], x[:8].astype(np.float64) @ wt.dense[:8].T)
    assert (y[8:] == SENTINEL).all() and (y[:, 8:] == SENTINEL).all()
    ids = np.array([7, 2], np.int32)
    di, dr = dev.upload(ids), _filled(dev, 2 * lay.k)
    dev.launch("packed", "pk_rows", Launch((1, 1, 1), (5, 1, 1)), dev.upload(wt.packed), *_layout_args(dev, lay, wt),
               di, Int(0), Int(n), di, Int(2), dr, Int(n), NULL, Int(1))
    got = dev.download(dr, (2 * lay.k,), np.float32)
    want = wt.dense[ids].astype(np.float32).reshape(-1)
    assert np.array_equal(got[:lay.k + 32], want[:lay.k + 32]) and (got[lay.k + 32:] == SENTINEL).all()


# ------------------------------------------------------------------------------------------ the executor
OPS = ("MatMulNBits", "QuantizedMatMul", "QuantizedEmbedding", "QuantizedMoEExperts")
PACKED_INPUT = {"MatMulNBits": 1, "QuantizedMatMul": 1, "QuantizedEmbedding": 1}


def _packed_names(case: Any) -> list[str]:
    """The packed tensors of a case's node: B, W, or the three expert banks."""
    node = case.graph.nodes[0]
    if node.op == "QuantizedMoEExperts":
        return [node.inputs[i] for i in (3, 5, 7)]
    return [node.inputs[PACKED_INPUT[node.op]]]


WEIGHTED = [c for c in cases() if c.op in OPS and all(n in c.weights for n in _packed_names(c))]


def _worst(exe: Any, case: Any) -> float:
    got = exe.run(case.feeds)
    want = evaluate(case.graph, case.feeds, case.ref_weights)
    return max(float(np.abs(got[n] - want[n]).max() / max(float(np.abs(want[n]).max()), 1e-6))
               for n in case.graph.outputs)


@pytest.mark.parametrize("case", WEIGHTED, ids=lambda c: c.id)
def test_the_weight_stays_packed_on_the_device(case: Any) -> None:
    """The packed tensor is uploaded as its stored bytes and never as f32 values; scales and offsets as words."""
    exe = CudaBackend(device=HostDevice()).compile(case.graph, None, ArrayWeights(case.weights))
    try:
        assert _worst(exe, case) <= case.tol
        forms = dict(exe._resident)
        for name in _packed_names(case):
            assert (name, "packed") in forms and (name, "f32") not in forms, name
            assert forms[(name, "packed")].nbytes == case.weights[name].nbytes
    finally:
        exe.close()


@pytest.mark.parametrize("case", [c for c in WEIGHTED if c.op == "QuantizedEmbedding" or c.name in (
    "q4_b32_zp_prefill", "f32_q4_b128_float_zp", "affine_q3_g128_f16_act", "mxfp8_prefill", "nvfp4_decode",
    "affine_bf16_batch", "mxfp4_batch")], ids=lambda c: c.id)
def test_a_streamed_packed_weight_gives_the_resident_result(case: Any) -> None:
    """The packed tensors streamed in pieces of a few rows (an expert bank: the chosen experts; an embedding table:
    the rows its ids select): the same result as resident, on the host model with its adversarial stream order, and
    the packed bytes went through the staging slots, not a resident upload."""
    names = _packed_names(case)
    dev = HostDevice(order="behind")
    exe = CudaBackend(device=dev).compile(case.graph, None, ArrayWeights(case.weights), streamed=names,
                                          chunk_bytes=3 * case.weights[names[0]][0].nbytes)
    try:
        before = dev.h2d_bytes
        assert _worst(exe, case) <= case.tol
        assert not any(name == n for name, _ in exe._resident for n in names)
        assert dev.h2d_bytes > before
    finally:
        exe.close()


@pytest.mark.parametrize("case", [c for c in WEIGHTED if c.op == "QuantizedEmbedding"], ids=lambda c: c.id)
def test_a_streamed_table_serves_computed_ids_piece_by_piece(case: Any) -> None:
    """Ids the graph computes (here an Identity of the fed ones) are not on the host to gather rows by: each piece
    of the streamed table writes the rows of the ids that fall in it."""
    from dataclasses import replace

    from uaii.ir import Node, Tensor, make_graph

    g, node = case.graph, case.graph.nodes[0]
    ids = node.inputs[0]
    fed = Tensor("fed_ids", g.tensor(ids).dtype, g.tensor(ids).shape)
    graph = make_graph(g.name, [Node("ids", "Identity", ("fed_ids",), (ids,)), node], [*g.tensors, fed],
                       ["fed_ids"], list(g.outputs))
    case = replace(case, graph=graph, feeds={"fed_ids": case.feeds[ids]})
    table = node.inputs[1]
    exe = CudaBackend(device=HostDevice(order="behind")).compile(
        graph, None, ArrayWeights(case.weights), streamed=[table], chunk_bytes=7 * case.weights[table][0].nbytes)
    try:
        assert _worst(exe, case) <= case.tol
        assert (table, "packed") not in exe._resident
    finally:
        exe.close()


def test_fed_packed_words_are_bits_and_must_be_uint32() -> None:
    """A fed uint32 weight's words past 2^31 are bits (fed as they are, where an integer value there is refused);
    the same words fed as int64 are refused by name, not converted."""
    from uaii.backends.base import BackendError

    case = next(c for c in cases() if c.id == "QuantizedMatMul/affine_fed")
    assert case.feeds["W"].max() >= 2 ** 31
    exe = CudaBackend(device=HostDevice()).compile(case.graph, None, ArrayWeights(case.weights))
    try:
        assert _worst(exe, case) <= case.tol
        with pytest.raises(BackendError, match=r"input 'W': .*packed words must be fed as uint32"):
            exe.run({**case.feeds, "W": case.feeds["W"].astype(np.int64)})
    finally:
        exe.close()


@pytest.mark.parametrize(("rows", "m"), [(1, 1), (37, 11), (5, 8), (4, 9)])
def test_packed_gemv_geometry_covers_each_product_once(rows: int, m: int) -> None:
    at = geometry.packed_gemv(rows, m)
    assert at.block == (geometry.WARP, geometry.GEMV_WARPS, 1)
    assert at.grid[0] * geometry.GEMV_WARPS - rows in range(geometry.GEMV_WARPS)
    assert at.grid[1] * geometry.PACKED_ROWS - m in range(geometry.PACKED_ROWS)


def test_pair_chunks_cover_every_pair_in_whole_tokens() -> None:
    for pairs, k in ((6, 2), (200_000, 3), (65535 * 2 + 7, 1), (8, 8)):
        chunks = geometry.pair_chunks(pairs, k)
        assert [s for s, _ in chunks] == list(np.cumsum([0] + [n for _, n in chunks[:-1]]))
        assert sum(n for _, n in chunks) == pairs and all(s % k == 0 and n <= geometry.MAX_GRID_YZ for s, n in chunks)


def test_a_token_id_outside_a_quantized_table_raises_naming_the_node() -> None:
    """QuantizedEmbedding faults on an id outside the table (the CPU reference's error), as Embedding does."""
    from uaii.backends.base import ArrayWeights, BackendError
    from uaii.backends.cuda.backend import CudaBackend

    case = next(c for c in cases() if c.op == "QuantizedEmbedding" and c.feeds)
    ids = next(n for n in case.graph.inputs if n in case.feeds)
    exe = CudaBackend(device=HostDevice(kernels="compiled")).compile(case.graph, None, ArrayWeights(case.weights))
    good = exe.run(case.feeds)
    bad = np.array(case.feeds[ids]).copy()
    bad.reshape(-1)[0] = 10 ** 6
    with pytest.raises(BackendError, match=r"node '.*QuantizedEmbedding': a token id outside the table's"):
        exe.run({**case.feeds, ids: bad})
    for name, value in exe.run(case.feeds).items():
        np.testing.assert_array_equal(value, good[name])
    exe.close()
