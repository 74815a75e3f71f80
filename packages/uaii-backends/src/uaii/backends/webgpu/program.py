"""What a lowering emits and reads: device regions, dispatches of WGSL kernels, and uploads of streamed weights.

A run of a WebGPU executable is a *program*: a list of :class:`Dispatch` (one compute shader over bound regions) and
:class:`Upload` (copy a streamed weight from the host store into a staging region). Dispatches between two uploads go
into one command buffer; an upload ends it, since the queue orders ``write_buffer`` after the work submitted before.

Conventions every kernel follows, so that lowerings stay short:
- binding 0 is a uniform ``Params`` struct of 4-byte scalars in the order the lowering passes them (``u32`` for
  Python ints >= 0, ``i32`` for negative ints, ``f32`` for floats); bindings 1..n are storage buffers in the order
  of ``regions``, every one declared ``var<storage, read_write>`` — activations share one arena buffer, and WebGPU
  forbids binding one buffer read-only and writable in the same dispatch (writable bindings may repeat). Every
  declared binding must be used by the shader (pipelines use the automatic layout).
- On the device every float value is ``f32`` and every integer value ``i32`` (WGSL has no 64-bit integers); feeds
  and outputs are converted at the edge. Block-quantized data stays raw bytes, read as ``array<u32>``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.base import BackendError
from uaii.ir import DType
from uaii.ir.reference import bf16_to_f32, f32_to_bf16

if TYPE_CHECKING:
    from uaii.backends.webgpu.device import GpuDevice

Scalar = int | float
ParamsFn = Callable[[], Sequence[Scalar]]


@dataclass(frozen=True)
class Region:
    """A byte range of a device buffer: what one binding sees."""

    buffer: Any
    offset: int
    nbytes: int

    def binding(self, index: int) -> dict[str, Any]:
        return {"binding": index, "resource": {"buffer": self.buffer, "offset": self.offset,
                                                "size": max(4, -(-self.nbytes // 4) * 4)}}


@dataclass
class Dispatch:
    """One compute shader invocation. ``params`` is a uniform buffer; ``refresh`` (when set) recomputes its
    contents before every run (KV lengths, positions that change per step)."""

    node: str
    pipeline: Any
    bind_group: Any
    groups: tuple[int, int, int]
    params: Any = None
    refresh: ParamsFn | None = None


@dataclass
class Upload:
    """Copy a streamed weight into ``region`` before the dispatches that follow: ``write(queue)`` reads its host
    bytes and writes them with ``queue.write_buffer`` (straight from the store's buffer, no host copy between)."""

    node: str
    ref: str
    region: Region
    write: Callable[[Any], None]


Op = Dispatch | Upload


def pack_params(values: Sequence[Scalar]) -> bytes:
    """The uniform bytes of ``values`` (see the module doc), padded to 16 bytes."""
    out = bytearray()
    for v in values:
        if isinstance(v, bool | np.bool_):
            out += struct.pack("<I", int(v))
        elif isinstance(v, int | np.integer):
            out += struct.pack("<i" if int(v) < 0 else "<I", int(v))
        else:
            out += struct.pack("<f", float(v))
    out += b"\0" * (-len(out) % 16 or (16 if not out else 0))
    return bytes(out)


def padded(raw: bytes | np.ndarray) -> np.ndarray:
    """``raw`` as bytes padded to a multiple of 4, as ``write_buffer`` requires (copied only when it must grow)."""
    data = np.ascontiguousarray(np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw).reshape(-1)
    data = data.view(np.uint8)
    pad = -data.size % 4
    return data if not pad else np.concatenate([data, np.zeros(pad, np.uint8)])


def bind(dev: GpuDevice, pipeline: Any, params: Sequence[Scalar], regions: Sequence[Region]) -> tuple[Any, Any]:
    """A bind group of ``pipeline``: a new uniform buffer holding ``params`` at binding 0, then ``regions`` at
    bindings 1..n (the convention in the module doc). Returns ``(bind_group, uniform_buffer)``; the buffer is what
    a refresh rewrites."""
    data = pack_params(params)
    ubuf = dev.buffer(len(data), storage=False, uniform=True)
    dev.queue.write_buffer(ubuf, 0, data)
    entries = [{"binding": 0, "resource": {"buffer": ubuf, "offset": 0, "size": ubuf.size}}]
    entries += [r.binding(i + 1) for i, r in enumerate(regions)]
    return dev.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries), ubuf


def device_dtype(dtype: DType) -> str:
    """How a value of ``dtype`` lives on the device: ``f32``, ``i32`` or ``raw`` (block-quantized bytes)."""
    if dtype.is_quantized:
        return "raw"
    if dtype.is_float:
        return "f32"
    return "i32"


def device_nbytes(dtype: DType, count: int) -> int:
    kind = device_dtype(dtype)
    return dtype.nbytes(count) if kind == "raw" else 4 * count


def to_device(a: np.ndarray, dtype: DType) -> np.ndarray:
    """Host array → the bytes the device holds for it (f32 for floats, i32 for ints, raw bytes for block types)."""
    kind = device_dtype(dtype)
    if kind == "raw":
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    if dtype is DType.BF16:
        return bf16_to_f32(np.ascontiguousarray(a).reshape(-1).view(np.uint16))
    if kind == "f32":
        return np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    a = np.ascontiguousarray(a)  # a u32 keeps its bits in the word (the kernels know it is unsigned); 64-bit types
    if a.dtype.itemsize > 4 and a.dtype.kind in "iu" and a.size and (a.min() < -2 ** 31 or a.max() > 2 ** 31 - 1):
        bad = a[(a < -2 ** 31) | (a > 2 ** 31 - 1)].flat[0]
        raise BackendError(f"{dtype.value} value {int(bad)} lies beyond the device's 32-bit integers (a wrapped "
                           "value would be a wrong number)")
    return a.astype(np.int32, casting="unsafe").reshape(-1)


def from_device(raw: bytes | memoryview, dtype: DType, shape: Sequence[int]) -> np.ndarray:
    """The device bytes of a value → a host array of its declared dtype and shape."""
    count = int(np.prod(shape, dtype=np.int64))
    kind = device_dtype(dtype)
    if kind == "raw":
        return np.frombuffer(raw, np.uint8, dtype.nbytes(count)).copy()
    if kind == "i32":
        return np.frombuffer(raw, np.int32, count).astype(dtype.numpy).reshape(shape)
    f = np.frombuffer(raw, np.float32, count)
    if dtype is DType.BF16:
        return f32_to_bf16(f).reshape(shape)
    return f.astype(dtype.numpy).reshape(shape)


def split_groups(n: int, limit: int) -> tuple[int, int, int]:
    """Workgroup counts covering ``n`` groups within the per-dimension limit (x first, then y); kernels compute
    their linear group as ``gid.x + gid.y * nwg.x`` and return when past ``n``."""
    n = max(int(n), 1)
    if n <= limit:
        return (n, 1, 1)
    y = -(-n // limit)
    return (-(-n // y), y, 1)


__all__ = ["Dispatch", "Op", "ParamsFn", "Region", "Upload", "bind", "device_dtype", "device_nbytes", "from_device",
           "pack_params", "padded", "split_groups", "to_device"]
