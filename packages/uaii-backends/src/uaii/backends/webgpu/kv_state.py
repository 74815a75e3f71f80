"""The KV cache of one sequence in device buffers: :class:`GpuKVState`.

The same protocol and semantics as the CPU's :class:`~uaii.backends.cpu.kv.KVState` — the slot and position
bookkeeping and the window policy are the shared :class:`~uaii.backends.kv_book.KVBook` — but the rows live on the
device: per layer one buffer of keys and one of values, ``[capacity, n_kv_heads, dim]`` f32 (or f16, two halves per
32-bit word), and one buffer of the absolute position of every slot (i32, -1 when empty) that the attention kernel
masks by. The host copy of the positions is the truth; every change is written through (a few bytes per step).

Compaction runs on the device: WebGPU forbids copies within one buffer, so the kept rows of each layer go to a
staging buffer and back down to slot ``sinks`` (``copy_buffer_to_buffer``, in one command buffer for all layers).
Under ``positions="cache"`` the keys come back through a compute shader instead, which rotates them by the slot
shift on the way (the same rotation as the RoPE kernel; see ops/rope.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.backends.kv_book import KeyRope, KVBook, KVCacheFull
from uaii.backends.webgpu.ops.elementwise import store_fn
from uaii.backends.webgpu.ops.rope import ROPE_FNS, turns
from uaii.backends.webgpu.program import Region, bind, split_groups
from uaii.ir import DType

if TYPE_CHECKING:
    from uaii.backends.webgpu.device import GpuDevice
    from uaii.backends.webgpu.lower import Lower

WG = 256

WRITE = """// kv write {kv}
struct P { nk: u32, nv: u32, at_k: u32, at_v: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> kn: array<f32>;
@group(0) @binding(2) var<storage, read_write> vn: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<{kt}>;
@group(0) @binding(4) var<storage, read_write> vc: array<{kt}>;
{rnd}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i < p.nk) { kc[p.at_k + i] = {kval}; }
  if (i < p.nv) { vc[p.at_v + i] = {vval}; }
}
"""
"""New rows into the cache at slot ``used``: counts and offsets are in elements (f32) or words (f16, two halves
each: one invocation writes a whole word, never half of one another invocation writes)."""

ROTATE = """// kv key re-rotation {kv}
struct P { n: u32, d: u32, rot: u32, neox: u32, at: u32, delta: i32, _a: u32, _b: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> src: array<{kt}>;
@group(0) @binding(2) var<storage, read_write> inv: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<{kt}>;
{fns}{rnd}{ld}
fn rotated(i: u32) -> f32 {
  let c = i % p.d;
  if (c >= p.rot) { return ld(i); }
  let k = rope_k(c, p.rot, p.neox);
  let cs = rope_cs(p.delta, vec2<f32>(inv[2u * k], inv[2u * k + 1u]));
  return rope_mix(rope_first(c, p.rot, p.neox), ld(i), ld(i - c + rope_partner(c, p.rot, p.neox)), cs);
}
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;
  if (i >= p.n) { return; }
  {store}
}
"""
"""Keys moved down by compaction, from the staging copy ``src`` into the cache at ``at``, rotated by ``delta``
(R(p + delta) = R(delta) R(p)); ``n`` counts elements (f32) or words (f16)."""

_KINDS = {
    "f32": dict(kt="f32", kval="kn[i]", vval="vn[i]", ld="fn ld(i: u32) -> f32 { return src[i]; }\n",
                store="dst[p.at + i] = rotated(i);"),
    "f16": dict(kt="u32", kval="pack2x16float(vec2<f32>(rnd(kn[2u * i]), rnd(kn[2u * i + 1u])))",
                vval="pack2x16float(vec2<f32>(rnd(vn[2u * i]), rnd(vn[2u * i + 1u])))",
                ld="fn ld(i: u32) -> f32 { let w = unpack2x16float(src[i >> 1u]); "
                   "return select(w.x, w.y, (i & 1u) == 1u); }\n",
                store="dst[p.at + i] = pack2x16float(vec2<f32>(rnd(rotated(2u * i)), rnd(rotated(2u * i + 1u))));"),
}


def _source(template: str, kv: str) -> str:
    rnd = store_fn(DType.F16) if kv == "f16" else ""
    out = template.replace("{kv}", kv).replace("{fns}", ROPE_FNS).replace("{rnd}", rnd)
    for key, value in _KINDS[kv].items():
        out = out.replace("{" + key + "}", value)
    return out


class GpuKVState(KVBook):
    """Keys, values and slot positions of every cached layer in device buffers (see the module doc)."""

    def __init__(self, dev: GpuDevice, layers: Sequence[tuple[int, int, int]], capacity: int, *,
                 dtype: str = "f32", window: int = 0, sinks: int = 4, max_tokens: int = 512,
                 positions: str = "absolute", rotations: Sequence[KeyRope] = ()) -> None:
        """``layers``: (n_kv_heads, head_dim_k, head_dim_v) per layer; ``capacity``: slots per layer
        (``window + sinks`` when windowed); ``rotations``: per layer, the RoPE of its keys (``positions="cache"``
        only: compaction re-rotates the keys it moves)."""
        super().__init__(len(layers), capacity, dtype=dtype, window=window, sinks=sinks, max_tokens=max_tokens,
                         positions=positions, rotations=rotations)
        self.dev = dev
        self.layers = [(int(h), int(dk), int(dv)) for h, dk, dv in layers]
        self.elt = 4 if dtype == "f32" else 2
        self.k: list[Any] = []
        self.v: list[Any] = []
        for i, (h, dk, dv) in enumerate(self.layers):
            if dtype == "f16" and (dk % 2 or dv % 2):
                raise KVCacheFull(f"[kv] webgpu: an f16 cache packs two halves per word; layer {i} has head dims "
                                  f"{dk} (k) and {dv} (v), which must be even (use dtype='f32')")
            for rows, dim in ((self.k, dk), (self.v, dv)):
                nbytes = self.capacity * h * dim * self.elt
                if nbytes > dev.max_binding:
                    raise KVCacheFull(f"[kv] webgpu: layer {i} needs {nbytes} bytes per cache buffer for "
                                      f"{self.capacity} slots, more than the adapter's storage binding limit "
                                      f"{dev.max_binding}; lower max_context or set kv_window")
                rows.append(dev.buffer(nbytes))
        self._pos = dev.buffer(4 * self.capacity)
        self._staging: Any = None
        self._inv: list[Any] = []
        for rope in self.rotations:
            inv = turns(rope.inv_freq)
            buf = dev.buffer(max(inv.nbytes, 4))
            dev.queue.write_buffer(buf, 0, inv.tobytes())
            self._inv.append(buf)
        self._positions_changed(0, self.capacity)

    # --- what lowerings bind ------------------------------------------------------------------------------------
    def _row_bytes(self, layer: int, values: bool) -> int:
        h, dk, dv = self.layers[layer]
        return h * (dv if values else dk) * self.elt

    def k_region(self, layer: int) -> Region:
        return Region(self.k[layer], 0, self.capacity * self._row_bytes(layer, False))

    def v_region(self, layer: int) -> Region:
        return Region(self.v[layer], 0, self.capacity * self._row_bytes(layer, True))

    def pos_region(self) -> Region:
        return Region(self._pos, 0, 4 * self.capacity)

    def write_rows(self, ctx: Lower, layer: int, k_new: Region, v_new: Region, t: int) -> None:
        """Record the dispatch that writes a run's ``t`` new K/V rows at slot ``used`` (evaluated per run)."""
        nk, nv = t * self._row_bytes(layer, False) // 4, t * self._row_bytes(layer, True) // 4
        kslot, vslot = self._row_bytes(layer, False) // 4, self._row_bytes(layer, True) // 4

        def params() -> list[int]:
            return [nk, nv, self.used * kslot, self.used * vslot]

        src = _source(WRITE, self.dtype)
        ctx.dispatch(src, [k_new, v_new, self.k_region(layer), self.v_region(layer)], params,
                     -(-max(nk, nv) // WG))

    # --- KVBook hooks ---------------------------------------------------------------------------------------
    def _positions_changed(self, lo: int, hi: int) -> None:
        if hi > lo:
            self.dev.queue.write_buffer(self._pos, 4 * lo, np.ascontiguousarray(self.pos[lo:hi]).tobytes())

    def _move(self, start: int, dst: int, count: int) -> None:
        """Every layer's rows through the staging buffer and back down; keys rotated on the way back under cache
        positions. One command buffer, whose commands the device runs in order."""
        dev = self.dev
        staging = self._staging_buffer()
        enc = dev.device.create_command_encoder()
        keep: list[Any] = []  # params buffers and bind groups of the rotations, alive until submitted
        for layer in range(len(self.layers)):
            for bufs, values in ((self.k, False), (self.v, True)):
                row = self._row_bytes(layer, values)
                buf = bufs[layer]
                enc.copy_buffer_to_buffer(buf, start * row, staging, 0, count * row)
                if not values and self.rotations:
                    keep += self._rotate(enc, layer, staging, dst, count, dst - start)
                else:
                    enc.copy_buffer_to_buffer(staging, 0, buf, dst * row, count * row)
        dev.queue.submit([enc.finish()])

    def _staging_bytes(self) -> int:
        """Bytes of the compaction staging buffer: the largest K or V buffer of any layer."""
        return max((self.capacity * self._row_bytes(i, v) for i in range(len(self.layers)) for v in (False, True)),
                   default=0)

    def _staging_buffer(self) -> Any:
        if self._staging is None:
            self._staging = self.dev.buffer(self._staging_bytes())
        return self._staging

    def _rotate(self, enc: Any, layer: int, staging: Any, dst: int, count: int, delta: int) -> list[Any]:
        rope = self.rotations[layer]
        h, dk, _ = self.layers[layer]
        words = 1 if self.dtype == "f32" else 2
        n = count * h * dk // words
        at = dst * h * dk // words
        pipeline = self.dev.pipeline(_source(ROTATE, self.dtype))
        regions = [Region(staging, 0, count * self._row_bytes(layer, False)),
                   Region(self._inv[layer], 0, 4 * rope.rot), self.k_region(layer)]
        group, ubuf = bind(self.dev, pipeline, [n, dk, rope.rot, int(rope.neox), at, delta, 0, 0], regions)
        cpass = enc.begin_compute_pass()
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*self._groups(-(-n // WG)))
        cpass.end()
        return [ubuf, group]

    def _groups(self, n: int) -> tuple[int, int, int]:
        return split_groups(n, self.dev.max_workgroups)

    # --- sizes and inspection -------------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def nbytes(self) -> int:
        """Device bytes of keys and values at capacity, plus the positions and, for a windowed cache, the staging
        buffer compaction moves rows through (allocated at the first compaction)."""
        kv = sum(self.capacity * (self._row_bytes(i, False) + self._row_bytes(i, True))
                 for i in range(len(self.layers)))
        staging = self._staging_bytes() if self.window else 0
        return kv + 4 * self.capacity + staging

    def rows(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys and values of slots ``[0, used)`` of ``layer`` read back as float32 (tests, debugging)."""
        h, dk, dv = self.layers[layer]
        out = []
        for buf, dim, values in ((self.k[layer], dk, False), (self.v[layer], dv, True)):
            n = self.used * self._row_bytes(layer, values)
            raw = self.dev.queue.read_buffer(buf, 0, max(-(-n // 4) * 4, 4))
            typ = np.float32 if self.dtype == "f32" else np.float16
            out.append(np.frombuffer(raw, typ, self.used * h * dim).astype(np.float32).reshape(self.used, h, dim))
        return out[0], out[1]

    def device_positions(self) -> np.ndarray:
        """The slot positions as the device holds them (tests: they must equal ``pos``)."""
        raw = self.dev.queue.read_buffer(self._pos, 0, 4 * self.capacity)
        return np.frombuffer(raw, np.int32, self.capacity).copy()

    def __repr__(self) -> str:
        return (f"<GpuKVState layers={self.n_layers} length={self._length} used={self.used}/{self.capacity} "
                f"{self.dtype}{f' window={self.window}+{self.sinks}' if self.window else ''}"
                f"{' positions=cache' if self.positions == 'cache' else ''}>")


__all__ = ["GpuKVState"]
