"""IGemm: ``y = x . W^T`` with W [n, k] kept packed in its storage type.

A provider implements :class:`IGemm`; providers are listed by :func:`gemm_providers` and chosen by name with
:func:`get_gemm`. Built in:

``c-q8dot``        the C kernels: activations quantized to 32-value int8 blocks on the fly and integer dot
                   products (VNNI / AVX2 / NEON / scalar) for block types; F32/F16/BF16 weights in float. Decode
                   (1-3 rows) runs per-type GEMV kernels, batches a cache-blocked tile kernel over repacked chunks
                   of weight rows that sums every row exactly as the GEMV kernel does (same bits).
``c-precise``      c-q8dot with 16-bit activations for the types that have such a kernel (Q8_0: ~100x less
                   activation error, batches ~2.5x slower), the same as c-q8dot for the others (C mode 2). For a
                   projection whose output matters more than its time: the CPU backend runs a graph's output
                   MatMul (the logits, one row per generated token) this way.
``c-f32``          the C kernels, dequantizing chunks of weight rows to f32 and using f32 dots (every type).
``numpy-dequant``  the reference: dequantize the whole weight, then numpy's BLAS matmul in f32.

Every provider also runs ONNX MatMulNBits weights (:meth:`PackedWeight.from_nbits`, the layout of
:mod:`uaii.kernels.nbits`): the C ones on the packed bytes through ``uk_nbits_gemm`` (c-q8dot and c-precise: int8
activations per 32 values and integer dots, bit-identical on every ISA, batch size and thread count; c-f32: rows
dequantized to f32), numpy-dequant through :func:`~uaii.kernels.nbits.dequantize_nbits`. Likewise MLX-quantized
weights (:meth:`PackedWeight.from_mlx`, the layout of :mod:`uaii.kernels.mlxq`): the C providers all run
``uk_mlx_gemm`` (f32 activations, the weight dequantized in registers for decode rows and by chunks for batches,
bit-identical on every ISA, batch size and thread count), numpy-dequant through
:func:`~uaii.kernels.mlxq.dequantize_mlx`.

Third-party providers register under the entry-point group ``uaii.gemm`` (an object or a zero-argument factory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np

from uaii.ir.dtype import DType
from uaii.ir.errors import UnsupportedDType
from uaii.kernels.held import from_held, held_kernel_type
from uaii.kernels.mlxq import MlxLayout, dequantize_mlx, mlx_layout
from uaii.kernels.native import KernelError, check, f32, ffi, lib, ptr, view_ptr
from uaii.kernels.nbits import NBitsLayout, dequantize_nbits, nbits_layout
from uaii.kernels.quant import DEQUANT_TYPES, as_bytes, dequantize

FAST_TYPES: frozenset[DType] = DEQUANT_TYPES
"""Weight types of the integer / native-float path of c-q8dot: every type it reads. Decode rows and batches of one
type compute the same sums in the same order (see docs/kernels.md, "Prefill and decode agree")."""


@dataclass(frozen=True)
class PackedWeight:
    """A weight matrix [n, k] in its storage type: ``data`` holds the packed bytes (no copy of the caller's).
    ``nbits``: the layout of an ONNX MatMulNBits weight (then ``data`` is its B bytes and ``dtype`` is u8); ``mlx``:
    the layout of an MLX-quantized weight (then ``data`` is its packed words, flat, and ``dtype`` is u32); ``form``:
    the held form its rows are in (uaii.kernels.held; None: the file's layout)."""

    data: np.ndarray
    dtype: DType
    n: int
    k: int
    _ptr: Any = field(default=None, repr=False, compare=False)
    nbits: NBitsLayout | None = None
    mlx: MlxLayout | None = None
    form: str | None = None

    @classmethod
    def from_raw(cls, raw: Any, dtype: DType | str, shape: tuple[int, int], form: str | None = None) -> PackedWeight:
        """Wrap packed bytes (a GGUF tensor's data, a memory map, bytes) of a [n, k] matrix; ``form``: the held form
        the bytes are in (:func:`uaii.kernels.held.held_form`), None for the file's layout."""
        dt = DType.parse(dtype)
        if dt not in DEQUANT_TYPES:
            raise UnsupportedDType(dt, "gemm weights")
        n, k = (int(s) for s in shape)
        if k % dt.block_size:
            raise KernelError(f"[kernels] gemm: k = {k} is not a multiple of the {dt.value} block ({dt.block_size})")
        data = as_bytes(raw)
        need = dt.nbytes(n * k)
        if data.size < need:
            raise KernelError(f"[kernels] gemm: a [{n}, {k}] {dt.value} weight needs {need} bytes, got {data.size}")
        data = data[:need]
        if form is not None:
            held_kernel_type(dt, form)  # a form of this type, or KernelError
        return cls(data, dt, n, k, ptr(data), form=form)

    @classmethod
    def from_array(cls, w: np.ndarray) -> PackedWeight:
        """Wrap a float32 or float16 numpy matrix [n, k] (kept as is)."""
        dt = DType.from_numpy(w.dtype)
        if dt not in (DType.F32, DType.F16) or w.ndim != 2:
            raise KernelError(f"[kernels] gemm: from_array needs a 2-D float32/float16 array, got {w.dtype} {w.shape}")
        return cls.from_raw(np.ascontiguousarray(w), dt, w.shape)

    @classmethod
    def from_nbits(cls, b: Any, scales: Any, zero_points: Any = None, *, n: int, k: int, bits: int = 4,
                   block_size: int, scale_dtype: DType | str | None = None,
                   zp_dtype: DType | str | None = None) -> PackedWeight:
        """Wrap an ONNX MatMulNBits weight [n, k] (B bytes, scales, optional zero points; see uaii.kernels.nbits
        for the layout) without a copy; ``scale_dtype`` / ``zp_dtype`` where the arrays' numpy types do not say
        (bf16 as uint16 words). Raises KernelError when the arrays do not fit the layout."""
        data, layout = nbits_layout(b, scales, zero_points, n=n, k=k, bits=bits, block_size=block_size,
                                    scale_dtype=scale_dtype, zp_dtype=zp_dtype)
        return cls(data, DType.U8, n, k, ptr(data), layout)

    @classmethod
    def from_mlx(cls, w: Any, scales: Any, biases: Any = None, *, n: int, k: int, mode: str, bits: int,
                 group_size: int, scale_dtype: DType | str | None = None) -> PackedWeight:
        """Wrap an MLX-quantized weight [n, k] (``mx.quantize``'s packed uint32 words or their bytes, scales, biases
        in affine mode; see uaii.kernels.mlxq) without a copy; ``scale_dtype`` where the scales' numpy type does not
        say (bf16 as uint16 words). Raises KernelError when the arrays do not fit the layout."""
        data, layout = mlx_layout(w, scales, biases, n=n, k=k, mode=mode, bits=bits, group_size=group_size,
                                  scale_dtype=scale_dtype)
        return cls(data, DType.U32, n, k, ptr(data, "uint32_t *"), mlx=layout)

    @property
    def nbytes(self) -> int:
        extra = self.nbits.nbytes if self.nbits is not None else self.mlx.nbytes if self.mlx is not None else 0
        return int(self.data.nbytes) + extra

    def pointer(self) -> Any:
        return self._ptr if self._ptr is not None else ptr(self.data)

    @property
    def kernel_type(self) -> int:
        """The type id uk_gemm takes for these bytes: the GGUF type's, or its held form's."""
        return held_kernel_type(self.dtype, self.form)

    def dequantize(self) -> np.ndarray:
        if self.nbits is not None:
            return dequantize_nbits(self.data, self.nbits, self.n, self.k)
        if self.mlx is not None:
            lay = self.mlx
            return dequantize_mlx(self.data, lay.scales, lay.biases, n=self.n, k=self.k, mode=lay.mode, bits=lay.bits,
                                  group_size=lay.group_size, scale_dtype=lay.scale_dtype)
        raw = self.data if self.form is None else from_held(self.data, self.dtype, (self.n, self.k), self.form)
        return dequantize(raw, self.dtype, self.n * self.k).reshape(self.n, self.k)


def nbits_call(w: PackedWeight) -> tuple[Any, ...]:
    """The weight arguments of uk_nbits_gemm for a MatMulNBits weight: (bits, block_size, B, n, k, scales, scale
    type, zero points, zero-point type), pointers resolved (a backend binds them once with the rest)."""
    lay = w.nbits
    assert lay is not None
    st, zt = lay.codes
    return (lay.bits, lay.block_size, ffi.cast("uint8_t *", w.pointer()), w.n, w.k, ptr(lay.scales), st,
            ptr(lay.zero_points), zt)


def mlx_call(w: PackedWeight) -> tuple[Any, ...]:
    """The weight arguments of uk_mlx_gemm for an MLX-quantized weight: (mode, bits, group_size, W, n, k, scales,
    biases or NULL, scale type), pointers resolved (a backend binds them once with the rest)."""
    lay = w.mlx
    assert lay is not None
    mode, st = lay.codes
    return (mode, lay.bits, lay.group_size, ffi.cast("uint32_t *", w.pointer()), w.n, w.k, ptr(lay.scales),
            ptr(lay.biases), st)


def _prepare(x: np.ndarray, w: PackedWeight, out: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, int, int]:
    if x.dtype != np.float32:
        raise KernelError(f"[kernels] gemm: activations must be float32, got {x.dtype}")
    if x.shape[-1] != w.k:
        raise KernelError(f"[kernels] gemm: x has {x.shape[-1]} columns, the weight expects k = {w.k}")
    x2 = x.reshape(-1, w.k) if x.ndim != 2 else x
    m = x2.shape[0]
    if m > 1 and (x2.strides[1] != 4 or x2.strides[0] % 4 or x2.strides[0] < 4 * w.k or not x2.flags.aligned):
        x2 = np.ascontiguousarray(x2)
    if m <= 1:
        x2 = np.ascontiguousarray(x2)
        return x2, _out_for(x, w, out), m, w.k
    return x2, _out_for(x, w, out), m, x2.strides[0] // 4


def _out_for(x: np.ndarray, w: PackedWeight, out: np.ndarray | None) -> np.ndarray:
    oshape = (*x.shape[:-1], w.n)
    if out is None:
        return np.empty(oshape, np.float32)
    if out.shape != oshape or out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise KernelError(f"[kernels] gemm: out must be a writable C-contiguous float32 array of shape {oshape}")
    return out


@runtime_checkable
class IGemm(Protocol):
    """``y = x . W^T``; x [..., k] float32, W packed [n, k], y [..., n] float32 (``out`` preallocated or None)."""

    name: str

    def supports(self, dtype: DType) -> bool: ...

    def gemv(self, x: np.ndarray, w: PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
        """Decode: one activation row [k] -> [n]."""
        ...

    def gemm(self, x: np.ndarray, w: PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
        """Prefill / batches: rows [m, k] -> [m, n]."""
        ...


class _CGemm:
    """The C kernels (``uk_gemm``); mode 0 picks the fastest path per type, mode 1 dequantizes rows and uses f32
    dots, mode 2 is mode 0 with 16-bit activations where a type has that kernel. One driver serves all three."""

    def __init__(self, name: str, mode: int) -> None:
        self.name = name
        self._mode = mode

    def supports(self, dtype: DType) -> bool:
        return DType.parse(dtype) in DEQUANT_TYPES

    def gemm(self, x: np.ndarray, w: PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
        x2, y, m, ldx = _prepare(x, w, out)
        if w.nbits is not None:
            check(lib.uk_nbits_gemm(*nbits_call(w), ffi.NULL, view_ptr(x2), m, ldx, f32(y), w.n, self._mode),
                  f"MatMulNBits gemm [{w.n}, {w.k}] {w.nbits.bits}-bit, blocks of {w.nbits.block_size}")
            return y
        if w.mlx is not None:
            check(lib.uk_mlx_gemm(*mlx_call(w), ffi.NULL, view_ptr(x2), m, ldx, f32(y), w.n),
                  f"mlx gemm {w.mlx.mode} {w.mlx.bits}-bit, groups of {w.mlx.group_size}, [{w.n}, {w.k}]")
            return y
        check(lib.uk_gemm(w.kernel_type, w.pointer(), w.n, w.k, view_ptr(x2), m, ldx, f32(y), w.n, self._mode),
              f"gemm {w.form or w.dtype.value} [{w.n}, {w.k}]")
        return y

    gemv = gemm

    def __repr__(self) -> str:
        return f"<IGemm {self.name}>"


class NumpyDequantGemm:
    """Reference: dequantize W completely (C, bit-exact), then numpy's f32 matmul."""

    name = "numpy-dequant"

    def supports(self, dtype: DType) -> bool:
        return DType.parse(dtype) in DEQUANT_TYPES

    def gemm(self, x: np.ndarray, w: PackedWeight, out: np.ndarray | None = None) -> np.ndarray:
        _, y, _, _ = _prepare(x, w, out)
        np.matmul(x, w.dequantize().T, out=y)
        return y

    gemv = gemm


C_Q8DOT = _CGemm("c-q8dot", 0)
C_F32 = _CGemm("c-f32", 1)
C_PRECISE = _CGemm("c-precise", 2)
NUMPY_DEQUANT = NumpyDequantGemm()
_BUILTIN: dict[str, IGemm] = {p.name: p for p in (C_Q8DOT, C_F32, C_PRECISE, NUMPY_DEQUANT)}
_PROVIDERS: dict[str, IGemm] = dict(_BUILTIN)
_loaded_plugins = False


def register_gemm_provider(provider: IGemm) -> None:
    """Add (or replace) a provider under its ``name``."""
    if not isinstance(provider, IGemm):
        raise KernelError(f"[kernels] {provider!r} does not implement IGemm")
    _PROVIDERS[provider.name] = provider


def _load_plugins() -> None:
    global _loaded_plugins
    if _loaded_plugins:
        return
    _loaded_plugins = True
    for ep in entry_points(group="uaii.gemm"):
        if ep.name in _BUILTIN:
            continue
        obj = ep.load()
        register_gemm_provider(obj if isinstance(obj, IGemm) else obj())


def gemm_providers() -> list[str]:
    """Names of the available providers, the default first."""
    _load_plugins()
    return list(_PROVIDERS)


def get_gemm(name: str | None = None) -> IGemm:
    """A provider by name; None: the default, ``c-q8dot``."""
    _load_plugins()
    key = name or "c-q8dot"
    try:
        return _PROVIDERS[key]
    except KeyError:
        raise KernelError(f"[kernels] unknown gemm provider {key!r}; available: {', '.join(_PROVIDERS)}") from None


def matmul(x: np.ndarray, w: PackedWeight, *, out: np.ndarray | None = None, provider: str | None = None) -> np.ndarray:
    """``x . W^T`` with the chosen provider (default c-q8dot)."""
    return get_gemm(provider).gemm(x, w, out)


def gemm_path(dtype: DType | str, *, precise: bool = False) -> str:
    """How c-q8dot (``precise``: c-precise) runs a weight type: "int8-dot" (8-bit activations), "int16-dot" (16-bit
    activations: Q8_0 in c-precise), "float" or "dequant-f32". Raises UnsupportedDType."""
    dt = DType.parse(dtype)
    if dt not in DEQUANT_TYPES:
        raise UnsupportedDType(dt, "gemm weights")
    assert dt.gguf_id is not None
    if dt in (DType.F32, DType.F16, DType.BF16):
        return "float"
    path = lib.uk_gemm_path_mode(dt.gguf_id, 2 if precise else 0)          # uk_gemm's modes of the two providers
    return {2: "int8-dot", 4: "int16-dot"}.get(path, "dequant-f32")
