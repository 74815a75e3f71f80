"""Lowering of the packed weight layouts of other tools (ONNX's MatMulNBits, MLX's quantized ops) for the CUDA
executable: ``LOWER[op](binder, info)`` queues the node's launches on a
:class:`~uaii.backends.cuda.lower.Binder` (see lower.py's module doc).

The weight bits stay as stored: kernels/packed.cu decodes them in registers (pk_gemv for the products, pk_rows for
an embedding's rows, pk_gemv_idx for the experts a router chose). What the kernels read:

- the packed tensor (MatMulNBits' B, MLX's W, an expert bank) through the Binder's ``weight_reader`` in its stored
  bytes: resident, or a streamed one in pieces of whole rows (experts); a streamed bank moves only the chosen
  experts, a streamed embedding table only the rows its fed ids select. Fed by the caller instead, the value's arena
  words: a uint8 tensor holds a byte per word (the kernels' ``stride`` 4), a uint32 tensor's words are its bytes.
- scales, biases and zero points as 4-byte words: a weight's ``f32`` form (uploaded once: float values as float32,
  uint8 codes one per word, as the arena holds a fed one). They stay resident when the packed tensor streams.
- a bias, added after the product by ops.cu's bcast.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from uaii.backends.analysis import NodeInfo
from uaii.backends.cuda import geometry
from uaii.backends.cuda.executable import Piece, device_step
from uaii.backends.cuda.geometry import count
from uaii.backends.cuda.lower_ew import dtype_of, shape_of
from uaii.backends.cuda.sources import PACKED_MODES
from uaii.ir import DType
from uaii.ir.ops.quantized import BANK_SLOTS, BANKS

if TYPE_CHECKING:
    from uaii.backends.cuda.lower import Binder

c_int, c_ll, c_p = ctypes.c_int, ctypes.c_longlong, ctypes.c_uint64
AFFINE = {DType.F32: "affine_f32", DType.F16: "affine_f16", DType.BF16: "affine_bf16"}
"""MLX's affine mode by its scales' type: the type each value is rounded to (packed.cu's PK_AFFINE_*)."""


@dataclass(frozen=True)
class Packed:
    """A packed weight as the kernels take it: the packed tensor ``name`` of ``rows`` rows for its reader (weight
    rows, or a bank's experts), ``k`` values of ``bits`` per weight row in groups of ``group``, the ``mode``
    (sources.PACKED_MODES), the device bytes per stored byte; the scales' and offsets' addresses (offsets 0 when the
    mode has none) and their words per weight row."""

    name: str
    rows: int
    k: int
    bits: int
    group: int
    mode: str
    stride: int
    scales: int
    offs: int
    scales_ld: int
    offs_ld: int

    def args(self, r0: int = 0) -> tuple[Any, ...]:
        """The layout arguments of every packed.cu kernel (stride, k, bits, group, mode, scales, offsets), the
        parameter tables from weight row ``r0`` on."""
        offs = self.offs + 4 * r0 * self.offs_ld if self.offs else 0
        return (c_int(self.stride), c_int(self.k), c_int(self.bits), c_int(self.group), c_int(PACKED_MODES[self.mode]),
                c_p(self.scales + 4 * r0 * self.scales_ld), c_p(offs))


def _words(b: Binder, name: str) -> int:
    """Device address of a parameter table as 4-byte words: a weight's f32 form, a fed value's arena region; 0
    for an absent input."""
    if not name:
        return 0
    return b.exe.weight(name, "f32") if b.is_weight(name) else b.a(name)


def _per_row(b: Binder, name: str, rows: int) -> int:
    """Words of ``name`` per weight row (its [rows * per] values flattened, whatever its declared rank)."""
    return count(shape_of(b, name)) // rows if name else 0


def packed(b: Binder, name: str, scales: str, offs: str, *, rows: int, weight_rows: int, k: int, bits: int,
           group: int, mode: str) -> Packed:
    """The :class:`Packed` of packed tensor ``name`` with its scales and offsets (biases, zero points, or "")."""
    stride = 4 if not b.is_weight(name) and dtype_of(b, name) is DType.U8 else 1
    if dtype_of(b, name) is DType.U32 and name in b.exe.input_names:
        b.bit_feeds.add(name)  # its words are bits: fed as they are, not range-checked as integers
    return Packed(name, rows, k, bits, group, mode, stride, _words(b, scales), _words(b, offs),
                  _per_row(b, scales, weight_rows), _per_row(b, offs, weight_rows))


def _mlx(b: Binder, info: NodeInfo, name: str, scales: str, biases: str, *, rows: int, weight_rows: int, k: int,
         bits: int, group: int) -> Packed:
    """An MLX-quantized weight: the node's mode, affine by its scales' type."""
    mode = str(info.attrs["mode"])
    if mode == "affine":
        st = dtype_of(b, scales)
        if st not in AFFINE:
            raise b.fail(f"affine scales of {st.value} (the kernels round to f32, f16 or bf16)")
        mode = AFFINE[st]
    return packed(b, name, scales, biases, rows=rows, weight_rows=weight_rows, k=k, bits=bits, group=group, mode=mode)


def _read(b: Binder, p: Packed, launch: Callable[..., None]) -> None:
    """``launch(address, first row, rows)`` over the packed tensor: the Binder's weight reader for a weight (once,
    or per streamed piece), the value's arena region for a fed one."""
    if b.is_weight(p.name):
        b.weight_reader(p.name, "packed", p.rows, launch)
        return
    pw = b.a(p.name)
    b.steps.append(device_step(lambda ctx: launch(pw, 0, p.rows)))


def _product(b: Binder, p: Packed, x: str, y: str, bias: str, n: int) -> None:
    """y[..., :] = x[..., :] . W^T (+ bias): pk_gemv over every row of x (grids of PACKED_ROWS rows per block, in
    launches within the grid's y limit), each streamed piece writing its columns of y."""
    b.floats(x, y, *([bias] if bias else []))
    k = p.k
    m = count(shape_of(b, x)) // k
    if not m:
        return
    px, py, dev, stream = b.a(x), b.a(y), b.dev, b.exe.stream
    most = geometry.PACKED_ROWS * geometry.MAX_GRID_YZ

    def gemv(pw: int, r0: int, rows: int) -> None:
        for i0 in range(0, m, most):
            mi = min(most, m - i0)
            dev.launch("packed", "pk_gemv", geometry.packed_gemv(rows, mi), c_p(pw), c_int(rows), *p.args(r0),
                       c_p(px + 4 * i0 * k), c_ll(k), c_int(mi), c_p(py + 4 * (i0 * n + r0)), c_ll(n), stream=stream)
    _read(b, p, gemv)
    if bias:
        b.launch("ops", "bcast", geometry.elementwise(m * n), c_p(py), c_p(_words(b, bias)), c_ll(n), c_ll(1),
                 c_ll(m * n), c_p(py), c_int(0))


def matmul_nbits(b: Binder, info: NodeInfo) -> None:
    """ONNX's MatMulNBits: W = (q - zero point) * scale per block of B's rows, zero points packed like B, floats,
    or 2^(bits - 1)."""
    x, w, scales, zp, bias = (*info.node.inputs, "", "")[:5]
    a = info.attrs
    k, n, bits, bs = int(a["K"]), int(a["N"]), int(a.get("bits", 4)), int(a["block_size"])
    mode = "nbits" if not zp or dtype_of(b, zp) is DType.U8 else "nbits_float_zp"
    p = packed(b, w, scales, zp, rows=n, weight_rows=n, k=k, bits=bits, group=bs, mode=mode)
    _product(b, p, x, info.node.outputs[0], bias, n)


def quantized_matmul(b: Binder, info: NodeInfo) -> None:
    """MLX's quantized_matmul (transpose=True): Y = A @ W^T (+ bias)."""
    x, w, scales, biases, bias = (*info.node.inputs, "", "")[:5]
    a = info.attrs
    k, n = int(a["K"]), int(a["N"])
    p = _mlx(b, info, w, scales, biases, rows=n, weight_rows=n, k=k, bits=int(a["bits"]), group=int(a["group_size"]))
    _product(b, p, x, info.node.outputs[0], bias, n)


def quantized_embedding(b: Binder, info: NodeInfo) -> None:
    """MLX's QuantizedEmbedding: the rows the ids select, dequantized by pk_rows. A streamed table whose ids the
    caller feeds moves only those rows (read on the host, as Embedding's); otherwise a streamed table's pieces each
    serve the ids in their rows."""
    ids, w, scales, biases = (*info.node.inputs, "")[:4]
    y = info.node.outputs[0]
    if dtype_of(b, ids).is_float or dtype_of(b, ids).is_quantized:
        raise b.fail(f"QuantizedEmbedding ids {ids!r} are {dtype_of(b, ids).value} (the kernel reads integers)")
    a = info.attrs
    dim, vocab = int(a["dim"]), shape_of(b, w)[0]
    p = _mlx(b, info, w, scales, biases, rows=vocab, weight_rows=vocab, k=dim, bits=int(a["bits"]),
             group=int(a["group_size"]))
    r = count(shape_of(b, ids))
    if not r:
        return
    pids, py, dev, stream, exe = b.a(ids), b.a(y), b.dev, b.exe.stream, b.exe
    at = geometry.elementwise(r * -(-dim // 32))
    fault, code = b.fault(f"a token id outside the table's {vocab} rows")

    def rows(pw: int, r0: int, count: int, widx: int = pids) -> None:
        dev.launch("packed", "pk_rows", at, c_p(pw), *p.args(), c_p(widx), c_int(r0), c_int(r0 + count), c_p(pids),
                   c_int(r), c_p(py), c_int(vocab), c_p(fault), c_int(code), stream=stream)
    if not (b.is_weight(w) and w in exe.streamed and ids in exe.input_names):
        _read(b, p, rows)
        return
    row_bytes = exe.tensor(w).dtype.nbytes(count(shape_of(b, w)[1:]))
    piece = len(b.pieces)
    b.pieces.append(Piece(w, "gather", 0, r, r * row_bytes, ids=ids))
    exe.ids_ptr(r)  # sized now; read when the step runs (a later, longer binding may grow it)
    b.steps.append(exe.piece_step(piece, lambda slot: rows(slot, 0, r, exe.ids_ptr(r))))


def quantized_moe_experts(b: Binder, info: NodeInfo) -> None:
    """MLX's SwitchGLU over quantized banks: the Binder's expert FFN (gate and up, the activation, down, the
    weighted sum) with each bank's products a pk_gemv_idx launch on the chosen experts."""
    ins = (*info.node.inputs, *[""] * 12)
    x, indices = ins[0], ins[2]
    e, top_k = int(info.attrs["n_experts"]), int(info.attrs["top_k"])
    bits, groups = tuple(info.attrs["bits"]), tuple(info.attrs["group_sizes"])
    d = shape_of(b, x)[-1]
    ff = shape_of(b, ins[BANK_SLOTS["gate"][0]])[1]
    banks = []
    for i, bank in enumerate(BANKS):
        w, s, bias = (ins[slot] for slot in BANK_SLOTS[bank])
        banks.append(_mlx(b, info, w, s, bias, rows=e, weight_rows=e * shape_of(b, w)[1], k=ff if bank == "down" else d,
                          bits=int(bits[i]), group=int(groups[i])))
    dev, stream = b.dev, b.exe.stream

    def products(which: int, src: int, ldx: int, x_div: int, dst: int, rows: int, cols: int, pairs: int) -> None:
        p, pidx = banks[which], b.a(indices)

        def launch(pw: int, e0: int, count: int, idx: int = pidx) -> None:
            for s0, n_pairs in geometry.pair_chunks(pairs, top_k):
                dev.launch("packed", "pk_gemv_idx", geometry.gemv_pairs(rows, n_pairs), c_p(pw), c_int(rows),
                           *p.args(), c_p(src + 4 * (s0 // x_div) * ldx), c_ll(ldx), c_int(x_div), c_p(idx + 4 * s0),
                           c_int(e0), c_int(e0 + count), c_p(pidx + 4 * s0), c_p(dst + 4 * s0 * rows), c_ll(rows),
                           stream=stream)
        if b.is_weight(p.name) and p.name in b.exe.streamed:
            expert_bytes = b.exe.tensor(p.name).dtype.nbytes(count(shape_of(b, p.name)[1:]))
            b.gathered_experts(info, p.name, expert_bytes, pairs, launch)
        else:
            _read(b, p, launch)
    b.expert_ffn(info, ff, products)


LOWER: dict[str, Callable[[Binder, NodeInfo], None]] = {
    "MatMulNBits": matmul_nbits, "QuantizedMatMul": quantized_matmul, "QuantizedEmbedding": quantized_embedding,
    "QuantizedMoEExperts": quantized_moe_experts,
}
