"""The context a lowering sees while binding one node for one set of feed shapes (see program.py for the kernel
conventions). A lowering is ``def lower(ctx: Lower, info: NodeInfo) -> None`` that calls :meth:`Lower.dispatch`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.analysis import NodeInfo, VType
from uaii.backends.base import BackendError
from uaii.backends.webgpu.program import Dispatch, Op, ParamsFn, Region, Scalar, Upload, bind, split_groups
from uaii.ir import DType

if TYPE_CHECKING:
    from uaii.backends.webgpu.device import GpuDevice
    from uaii.backends.webgpu.executable import WebGpuExecutable


@dataclass(frozen=True)
class Shard:
    """Rows ``[start, stop)`` (along axis 0) of a weight, in one region no larger than a storage binding."""

    start: int
    stop: int
    region: Region


@dataclass(frozen=True)
class GpuWeight:
    """A weight on the device in its stored encoding (block-quantized bytes, f16/bf16 words, f32), split by rows
    into shards that each fit one binding. ``streamed``: its shards are staging regions refilled before use."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    shards: tuple[Shard, ...]
    streamed: bool = False

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        cols = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        return self.dtype.nbytes(cols)


class Lower:
    """Binding context for one shape key: the regions of every value, the program being built, the KV state."""

    def __init__(self, exe: WebGpuExecutable, regions: dict[str, Region], types: dict[str, VType],
                 state: Any) -> None:
        self.exe = exe
        self.dev: GpuDevice = exe.dev
        self.regions = regions
        self.types = types
        self.state = state
        self.program: list[Op] = []
        self.keep: list[Any] = []
        self.node = ""
        self._slots: dict[tuple[str, str], int] = {}
        self._uploads: dict[int, Upload] = {}  # id(shard region) → its upload
        self._loaded: dict[int, int] = {}  # id(staging buffer) → id(the shard region it holds now)

    # --- values --------------------------------------------------------------------------------------------
    def region(self, name: str) -> Region:
        """The region of an activation, or of a weight/constant as f32 (floats) / i32 (ints), read whole. A streamed
        weight read whole is staged like a packed one (its upload placed before the dispatch that binds it), so it
        never becomes resident behind the budget's back."""
        r = self.regions.get(name)
        if r is not None:
            return r
        if self.exe.is_weight(name):
            if not self.exe.is_streamed(name):
                return self.exe.plain_weight(name)
            up = self.exe.staged_whole(name, self.node, self._slot(name))
            self._uploads[id(up.region)] = up
            return up.region
        raise BackendError(f"[backend] webgpu: node {self.node!r} reads {name!r}, which has no device region")

    def is_weight(self, name: str) -> bool:
        return self.exe.is_weight(name)

    def is_streamed(self, name: str) -> bool:
        """Whether weight ``name`` stays on the host and passes through a staging buffer before each use."""
        return self.exe.is_streamed(name)

    def dtype(self, name: str) -> DType:
        return self.types[name].dtype

    def shape(self, name: str) -> tuple[int, ...]:
        return self.types[name].shape

    def count(self, name: str) -> int:
        return int(np.prod(self.types[name].shape, dtype=np.int64))

    def packed(self, name: str) -> GpuWeight:
        """A weight in its stored encoding, sharded by rows. A streamed weight's shards take turns in one staging
        buffer: each is uploaded right before the first dispatch that binds it (:meth:`dispatch`), so a lowering
        must dispatch shard by shard — binding two shards of one streamed weight at once is an error."""
        w, uploads = self.exe.packed_weight(name, self.node, self._slot(name))
        for u in uploads:
            self._uploads[id(u.region)] = u
        return w

    def _slot(self, name: str) -> int:
        """The staging buffer a streamed weight takes in this node: one per streamed weight the node reads."""
        return self._slots.setdefault((self.node, name), len([k for k in self._slots if k[0] == self.node]))

    def host(self, name: str) -> np.ndarray:
        """A weight's or constant's value on the host, as the device holds it (f32 floats, i32 ints): for lowerings
        that fold a weight into host-side setup (RoPE frequency factors) without a device round trip."""
        return self.exe.host_value(name)

    def derived(self, build: Callable[[], np.ndarray], key: str = "") -> Region:
        """A region of host-computed data that depends only on this node's weights and attributes, built and
        uploaded once per executable (not per binding); ``key`` tells apart several per node."""
        return self.exe.derived(f"{self.node}\0{key}", build)

    def const(self, info: NodeInfo, slot: int) -> np.ndarray | None:
        """A constant input's value on the host (shape inputs, axes), or None when the input is not a constant."""
        return info.consts.get(slot)

    def scratch(self, nbytes: int) -> Region:
        """A device region private to this binding (temporaries of multi-pass kernels)."""
        buf = self.dev.buffer(max(int(nbytes), 16))
        self.keep.append(buf)
        return Region(buf, 0, max(int(nbytes), 4))

    # --- kernels -------------------------------------------------------------------------------------------
    def groups(self, n: int) -> tuple[int, int, int]:
        return split_groups(n, self.dev.max_workgroups)

    def dispatch(self, source: str, regions: Sequence[Region], params: Sequence[Scalar] | ParamsFn,
                 groups: int | tuple[int, int, int], entry: str = "main") -> None:
        """Record one dispatch of ``source`` over ``regions`` (bindings 1..n) with uniform ``params`` (binding 0); a
        callable ``params`` is evaluated before every run."""
        if len(regions) > self.dev.max_storage_buffers:
            raise BackendError(f"[backend] webgpu: node {self.node!r} binds {len(regions)} storage buffers, the "
                               f"adapter allows {self.dev.max_storage_buffers}")
        for r in regions:
            if r.nbytes > self.dev.max_binding:
                raise BackendError(f"[backend] webgpu: node {self.node!r} binds {r.nbytes} bytes in one buffer, "
                                   f"more than the adapter's storage binding limit {self.dev.max_binding}")
        self._stage(regions)
        pipeline = self.dev.pipeline(source, entry)
        refresh: Callable[[], Sequence[Scalar]] | None = params if callable(params) else None
        first: Sequence[Scalar] = refresh() if refresh is not None else params  # type: ignore[assignment]
        try:
            group, ubuf = bind(self.dev, pipeline, first, regions)
        except Exception as exc:
            raise BackendError(f"[backend] webgpu: node {self.node!r}: binding {len(regions)} regions failed: "
                               f"{exc}") from exc
        g = self.groups(groups) if isinstance(groups, int) else groups
        self.program.append(Dispatch(self.node, pipeline, group, g, ubuf, refresh))


    def _stage(self, regions: Sequence[Region]) -> None:
        """Upload the streamed shards ``regions`` bind that their staging buffers do not hold at this point."""
        wanted: dict[int, Region] = {}
        for r in regions:
            if id(r) not in self._uploads:
                continue
            other = wanted.get(id(r.buffer))
            if other is not None and other is not r:
                raise BackendError(f"[backend] webgpu: node {self.node!r} binds two shards of one streamed weight in "
                                   "one dispatch; they share a staging buffer")
            wanted[id(r.buffer)] = r
        for buf, r in wanted.items():
            if self._loaded.get(buf) != id(r):
                self.program.append(self._uploads[id(r)])
                self._loaded[buf] = id(r)


Lowering = Callable[[Lower, NodeInfo], None]

__all__ = ["GpuWeight", "Lower", "Lowering", "Shard"]
