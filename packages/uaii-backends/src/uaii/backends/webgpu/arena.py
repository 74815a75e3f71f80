"""The WebGPU backend's arena rule: where each activation lives in the one arena buffer.

Reshape and Identity of an activation are views (the same region); every other activation owns a region placed
by liveness, first fit in order of birth (larger first among those born together), each offset a multiple of the
storage-binding offset alignment. :func:`lay_out` is the rule; the executable runs it for each binding, and
``WebGpuBackend.plan_arena`` states it for the planner as an :class:`~uaii.ir.plan.ArenaLayout`
(:func:`arena_of`: every symbolic feed dim at ``max_tokens``, :data:`ALIGN`). An executable compiled with a plan
places its regions at the plan's offsets, after :func:`uncovered` found nothing the plan's arena lacks.

Sizes are the device's (:func:`~uaii.backends.webgpu.program.device_nbytes`: floats and ints as 4-byte words, block
types raw), so the arena is what the device allocates, not the host size of the values.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from uaii.backends.analysis import NodeInfo, VType, arena_inputs
from uaii.backends.base import arena_problems
from uaii.backends.webgpu.program import device_nbytes
from uaii.ir import Graph
from uaii.ir.plan import ArenaLayout, BufferSlot

ARENA_RULE = "webgpu/1"
"""The identity of this rule (``Capabilities.arena``); bump it when the layout it makes changes."""
ALIGN = 256
"""The plan's offset alignment: WebGPU's largest ``minStorageBufferOffsetAlignment`` (what the executable uses,
``GpuDevice.offset_align``), so a plan holds on every adapter without opening one."""
VIEW_OPS = frozenset({"Reshape", "Identity"})


@dataclass
class Regions:
    """``root[value]``: the owner of the region it lives in; per owner its first and last step (node index; -1: a
    feed, ``len(infos) + 1``: an output), bytes on the device, offset; ``total``: the arena's bytes."""

    root: dict[str, str]
    born: dict[str, int]
    last: dict[str, int]
    size: dict[str, int]
    offset: dict[str, int]
    total: int


def lay_out(infos: Sequence[NodeInfo], feeds: Sequence[str], outputs: Sequence[str], stateful: frozenset[str],
            types: dict[str, VType], align: int) -> Regions:
    """The regions of every activation at ``types``: views share their source's, owners are placed first fit."""
    root: dict[str, str] = {}
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    end = len(infos) + 1
    for n in feeds:
        root[n], born[n], last[n] = n, -1, -1
    for i, info in enumerate(infos):
        node = info.node
        for x in node.inputs:
            if x in root:
                last[root[x]] = max(last[root[x]], i)
        for k, o in enumerate(node.outputs):
            if not o or o in stateful:
                continue
            src = node.inputs[0] if node.inputs else ""
            if k == 0 and node.op in VIEW_OPS and src in root:
                root[o] = root[src]
            else:
                root[o], born[o], last[o] = o, i, i
    for o in outputs:
        if o in root:
            last[root[o]] = end
    size = {r: max(4, device_nbytes(types[r].dtype, int(np.prod(types[r].shape, dtype=np.int64)))) for r in born}
    offset: dict[str, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (start, stop, born, last)
    for r in sorted(born, key=lambda r: (born[r], -size[r])):
        need = -(-size[r] // align) * align
        at = 0
        for s, e, b, la in sorted(placed):
            if la < born[r] or last[r] < b:
                continue
            if at + need <= s:
                break
            at = max(at, e)
        offset[r] = at
        placed.append((at, at + need, born[r], last[r]))
    total = max((e for _, e, _, _ in placed), default=16)
    return Regions(root, born, last, size, offset, total)


def _slot(r: Regions, owner: str, steps: int, types: dict[str, VType]) -> BufferSlot:
    first = max(r.born[owner], 0)
    return BufferSlot(owner, r.offset[owner], r.size[owner], types[owner].dtype.value, first,
                      max(min(r.last[owner], steps - 1), first))


def arena_of(graph: Graph, infos: Sequence[NodeInfo], max_tokens: int, *, rule: str = ARENA_RULE,
             align: int = ALIGN) -> ArenaLayout:
    """The arena an executable of ``graph`` with its KV state bound allocates for ``max_tokens`` tokens: the
    binding ``prepare`` makes at compile time (every symbolic feed dim at ``max_tokens``), one slot per owner.
    ``rule``/``align``: the identity and alignment of a backend that follows this rule at its own alignment (the
    CUDA backend: ``cuda/1``)."""
    a = arena_inputs(graph, infos, max_tokens)
    outputs = [n for n in graph.outputs if n not in a.stateful]
    r = lay_out(infos, a.feeds, outputs, a.stateful, a.types, align)
    slots = sorted((_slot(r, o, len(infos), a.types) for o in r.offset), key=lambda s: (s.first_step, s.value))
    return ArenaLayout(size=r.total, alignment=align, max_tokens=a.tokens, slots=tuple(slots), rule=rule)


def uncovered(r: Regions, arena: ArenaLayout, steps: int, types: dict[str, VType], align: int, *,
              rule: str = ARENA_RULE) -> Iterator[str]:
    """Why the plan's ``arena`` cannot hold the regions ``r`` (laid out for ``types``) at its offsets: the check
    every backend runs (:func:`uaii.backends.base.arena_problems`) on this rule's slots, at the device's offset
    alignment ``align``."""
    return arena_problems(arena, (_slot(r, o, steps, types) for o in r.born), rule=rule, align=align)


__all__ = ["ALIGN", "ARENA_RULE", "VIEW_OPS", "Regions", "arena_of", "lay_out", "uncovered"]
