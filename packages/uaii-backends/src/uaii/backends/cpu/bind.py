"""What a lowering sees while binding one node: the arrays of its values for the current shapes, prepared weights,
where the run's KV state will be (:class:`KVSlot`), and helpers for scratch buffers and index conversions.

A *step* is a zero-argument callable that returns a falsy value on success (``None``, or a C kernel's status 0).
Kernel steps are ``functools.partial`` objects over the cffi functions with every pointer and size resolved, so a
decode step runs no Python frame for them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from uaii.backends.base import BackendError
from uaii.backends.cpu.memory import NodeInfo, VType
from uaii.ir import DType, Graph
from uaii.ir.reference import bf16_to_f32, f32_to_bf16
from uaii.kernels import PackedWeight
from uaii.kernels.native import ffi, lib

if TYPE_CHECKING:
    from uaii.backends.cpu.kv import KVState

Step = Callable[[], Any]
NULL = ffi.NULL
BF16 = np.dtype(np.uint16)


def fptr(a: np.ndarray) -> Any:
    """A float* to the first element of a C-contiguous float32 array (a view of the arena, a weight, ...)."""
    return ffi.cast("float *", ffi.from_buffer(a))


def vptr(a: np.ndarray, ctype: str = "void *") -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a))


def status_fail(what: str, rc: int) -> BackendError:
    reason = {-1: "unsupported type", -2: "invalid arguments", -3: "out of memory", -4: "ISA not available"}
    return BackendError(f"[backend] {what}: kernel status {rc} ({reason.get(rc, 'unknown')})")


@dataclass
class WeightData:
    """A weight or constant as the store gave it: typed array for plain dtypes, raw uint8 for block types."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    raw: np.ndarray
    # a streamed weight's staging view: its bytes change from run to run, so a converted copy made while binding
    # would be stale (Bind.packed / Bind.f32_weight convert it in a step before the node's own instead)
    live: bool = False
    # the held form (uaii.kernels.held) a pinned weight's bytes are in; None: the file's layout
    form: str | None = None

    def as_f32(self) -> np.ndarray:
        """Float32 values (dequantized for block types; bf16 words widened)."""
        if self.dtype.is_quantized:
            from uaii.kernels import dequantize, from_held

            n = int(np.prod(self.shape))
            raw = self.raw if self.form is None else from_held(self.raw, self.dtype, (self.shape[0], self.shape[1]),
                                                               self.form)
            return dequantize(raw, self.dtype, n).reshape(self.shape)
        return to_f32(self.raw, self.dtype)


def to_f32(a: np.ndarray, dtype: DType) -> np.ndarray:
    """Float32 values of a plain-typed array (bf16 travels as raw uint16 words)."""
    if dtype is DType.BF16:
        return bf16_to_f32(a)
    return np.asarray(a, np.float32)


def from_f32(y: np.ndarray, dtype: DType) -> np.ndarray:
    """``y`` (float32 or wider) in ``dtype``; bf16 is rounded to nearest even, NaN kept quiet."""
    if dtype is DType.BF16:
        return f32_to_bf16(y)
    return np.asarray(y).astype(dtype.numpy, copy=False)


class CacheRows:
    """What a cached-attention step needs of one sequence's :class:`~uaii.backends.cpu.kv.KVState`, resolved once
    per state (pointers cost a cffi call each): per layer (keys, values, their pointers, kernel KV type: 1 = f16),
    and pointers to the run's positions and the slots' positions. Holds the state's arrays, never the state, so a
    cache of these keyed weakly by state lets a finished sequence's memory go."""

    __slots__ = ("layers", "pkpos", "pos", "pqpos", "q_pos")

    def __init__(self, state: KVState) -> None:
        self.layers = [(k, v, vptr(k), vptr(v), 1 if k.dtype == np.float16 else 0)
                       for k, v in zip(state.k, state.v, strict=True)]
        self.q_pos = state.q_pos  # prepare() may replace a too small array: the owner compares before a run
        self.pqpos = vptr(state.q_pos, "int32_t *")
        self.pos = state.pos  # the pointers' owners live as long as these
        self.pkpos = vptr(state.pos, "int32_t *")


class KVSlot:
    """The KV state(s) of the current run: set by the executable before the steps run, read by them at run time.

    Why an indirection: a binding (the steps of one feed shape) must not depend on WHICH sequence it runs with —
    a server alternates a prefill of one sequence with batched decodes of others, and rebinding per run would cost
    more than the run. ``batched``: one decode row per state (a KVBatch), else one state takes every row."""

    __slots__ = ("batched", "rows", "states")

    def __init__(self, batched: bool) -> None:
        self.batched = batched
        self.states: list[KVState] = []
        self.rows: list[CacheRows] = []


class BindHost(Protocol):
    """What a lowering may ask of the executable it binds for (CpuExecutable is one): the graph, which values are
    weights, prepared weights, the GEMM mode of a product, the layer index of a cached Attention node, per-compile
    caches and raw references of the weight source. Nothing else: a lowering never reaches into the executable."""

    @property
    def graph(self) -> Graph: ...

    @property
    def weight_names(self) -> Collection[str]: ...

    @property
    def kv_layer(self) -> Mapping[str, int]: ...

    def weight(self, name: str) -> WeightData: ...

    def packed(self, name: str, transpose_b: bool = True) -> PackedWeight: ...

    def f32_weight(self, name: str) -> np.ndarray: ...

    def gemm_mode_for(self, value: str) -> int: ...

    def cached(self, key: Any, make: Callable[..., Any]) -> Any: ...

    def acquire(self, ref: str) -> np.ndarray: ...


class Bind:
    """Binding context for one shape key. ``arrays`` maps every value to its array for these shapes."""

    def __init__(self, exe: BindHost, arrays: Mapping[str, np.ndarray], types: dict[str, VType],
                 state: KVSlot | None) -> None:
        """``state``: where the run's KV state(s) will be (None: the run has none)."""
        self.exe = exe
        self.arrays = arrays
        self.types = types
        self.state = state
        self.prologue: list[Step] = []
        self._converted: dict[tuple[str, str], np.ndarray] = {}
        self.keep: list[Any] = []  # objects whose lifetime must cover the binding (pointer owners)

    # --- values ------------------------------------------------------------------------------------------------
    def a(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def dtype(self, name: str) -> DType:
        return self.types[name].dtype

    def is_weight(self, name: str) -> bool:
        return name in self.exe.weight_names

    def weight(self, name: str) -> WeightData:
        return self.exe.weight(name)

    def packed(self, name: str, transpose_b: bool = True) -> PackedWeight:
        """The MatMul weight ``name`` as a packed [n, k] matrix (a transposed copy for [K, N] float weights; of a
        streamed weight, made by a step before the node's, from the bytes staged for this run)."""
        if not transpose_b:
            w = self.exe.weight(name)
            if w.live:
                buf = np.empty((w.shape[1], w.shape[0]), np.float32)
                self._refresh(buf, lambda: w.as_f32().reshape(w.shape).T)
                return PackedWeight.from_array(buf)
        return self.exe.packed(name, transpose_b)

    def f32_weight(self, name: str) -> np.ndarray:
        """A weight (or constant) as contiguous float32, converted once per compile (a streamed one: by a step
        before the node's, from the bytes staged for this run)."""
        if self.is_weight(name):
            w = self.exe.weight(name)
            if w.live and (w.dtype is not DType.F32 or not w.raw.flags.c_contiguous):
                buf = np.empty(w.shape, np.float32)
                self._refresh(buf, lambda: w.as_f32().reshape(w.shape))
                return buf
        return self.exe.f32_weight(name)

    def _refresh(self, buf: np.ndarray, values: Callable[[], np.ndarray]) -> None:
        """Fill ``buf`` from ``values()`` in a prologue step (run before the node's steps, every run)."""
        self.keep.append(buf)
        self.prologue.append(numpy_step(lambda: np.copyto(buf, values())))

    def gemm_mode(self, value: str) -> int:
        """The uk_gemm mode of the GEMM step that writes ``value`` (CpuExecutable.gemm_mode_for)."""
        return int(self.exe.gemm_mode_for(value))

    def scratch(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        buf = np.empty(shape, dtype)
        self.keep.append(buf)
        return buf

    def index_as(self, name: str, dtype: Any) -> np.ndarray:
        """Value ``name`` converted to ``dtype`` (int32 positions, int64 ids), once per run by a prologue step."""
        src = self.arrays[name]
        want = np.dtype(dtype)
        if src.dtype == want and src.flags.c_contiguous:
            return src
        key = (name, want.str)
        if key not in self._converted:
            dst = self.scratch(src.shape, want)
            self._converted[key] = dst

            def convert(src: np.ndarray = src, dst: np.ndarray = dst) -> None:
                np.copyto(dst, src, casting="unsafe")

            self.prologue.append(convert)
        return self._converted[key]


def kernel(fn: Any, *args: Any) -> Step:
    """A step calling a C kernel with bound arguments (no Python frame when run)."""
    from functools import partial

    return partial(fn, *args)


def numpy_step(fn: Callable[[], Any]) -> Step:
    """Wrap a numpy computation so that it returns None (a step's success value)."""

    def step() -> None:
        fn()

    return step


Lowering = Callable[[Bind, NodeInfo], list[Step]]

__all__ = ["BF16", "NULL", "Bind", "BindHost", "CacheRows", "KVSlot", "Lowering", "Step", "WeightData", "fptr",
           "from_f32", "kernel", "lib", "numpy_step", "status_fail", "to_f32", "vptr"]
