"""The storage plan: which weights stay pinned, which stream through staging buffers, and in what order.

Weights are grouped by layer (:func:`weight_group`). With a budget, the pin candidates are, in priority order:
small globals (final norm, rope factors: read every token), the embeddings, lm_head and the first ``pin_layers``
trunk layers. While pins + staging buffers + KV cache + expert cache + arena exceed the budget, pins are dropped:
the trunk layers (last first), then lm_head, then the embeddings, then the globals. Staging is recomputed exactly
for every candidate set: dropping a pin can enlarge the largest streamed step, and a drop that would not lower the
total is skipped (that weight is cheaper pinned than streamed). If even the smallest plan does not fit, a
:class:`BudgetError` names every number. With ``fill_pins``, further layers are then pinned, in execution order,
while the budget holds. Without a budget (0) every weight is memory-mapped and nothing is staged.

Staging: each buffer holds what one step streams at once (``stream_unit="tensor"``: a grouped MatMul needs all its
weights staged together; a MoE step stages top_k experts of each bank) or one whole layer (``"layer"``), every
tensor rounded up to a page as the staging pool allocates it. A tied embedding/lm_head table is one weight
reference, counted once.

Two uses stage less than the whole tensor: an Embedding lookup reads only its rows (``pread`` of each row, outside
the staging pool: it stages nothing), and a ``MatMul`` whose [N, K] weight is used transposed (a linear layer such
as the lm_head) is *row-chunkable*: the executor streams it in chunks of whole rows that fit one staging buffer.
In ``"tensor"`` mode a row-chunkable tensor therefore never sizes the staging buffers beyond the largest
unchunkable step (or :data:`CHUNK_MIN` when nothing else streams), so a large tied table can stream instead of
being pinned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from uaii.ir.dtype import tensor_nbytes
from uaii.ir.graph import Graph, Node, Tensor
from uaii.ir.ops.schema import OpKind
from uaii.ir.plan import ArenaLayout, ExecutionPlan, StoragePlan, WeightPlacement
from uaii.ir.registry import Registry, default_registry
from uaii.planner.errors import BudgetError, PlannerError
from uaii.planner.options import PlannerOptions

PAGE = 4096
"""The staging pool hands out page-multiple extents."""
CHUNK_MIN = 1 << 20
"""Smallest staging buffer a row-chunked tensor is cut for (when no unchunkable step needs more)."""

EMBED, LM_HEAD, NORM, OTHER = "embed", "lm_head", "norm", "other"

WEIGHT_GROUP_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^blk\.(\d+)\."), r"blk.\1"),
    (re.compile(r"^(token_embd|position_embd|token_types)\."), EMBED),
    (re.compile(r"^output\."), LM_HEAD),
    (re.compile(r"^output_norm\."), NORM),
    # Hugging Face spellings, for tensors a loader did not rename
    (re.compile(r"(^|\.)(layers|h|layer|blocks)\.(\d+)\."), r"blk.\3"),
    (re.compile(r"(^|\.)(embed_tokens|wte|wpe|word_embeddings|position_embeddings|token_type_embeddings)\."),
     EMBED),
    (re.compile(r"(^|\.)lm_head\."), LM_HEAD),
    (re.compile(r"(^|\.)(norm|ln_f|final_layernorm)\."), NORM),
]
"""(pattern, group template) tried in order on a weight's name; append rules to extend. No match → ``other``."""

_TRUNK = re.compile(r"^blk\.(\d+)$")


def weight_group(name: str, rules: Sequence[tuple[re.Pattern[str], str]] | None = None) -> str:
    """``embed`` | ``lm_head`` | ``norm`` | ``blk.N`` | ``other`` for a weight name (GGUF spelling first)."""
    for pattern, template in WEIGHT_GROUP_RULES if rules is None else rules:
        m = pattern.search(name)
        if m is not None:
            return m.expand(template)
    return OTHER


def group_of(tensor: Tensor) -> str:
    """The group of a weight tensor: from its tensor name, else from its weight reference's tensor name."""
    group = weight_group(tensor.name)
    if group == OTHER and tensor.weight is not None and tensor.weight.tensor:
        group = weight_group(tensor.weight.tensor)
    return group


def is_trunk(group: str) -> bool:
    return _TRUNK.match(group) is not None


# --- what each step reads -----------------------------------------------------------------------------------
@dataclass
class WeightUse:
    """One weight reference: its size, group, and what the steps that read it stage and read per token."""

    ref: str
    nbytes: int
    group: str
    first_use: int
    streamable: bool
    per_token: int = 0
    staged: dict[int, int] = field(default_factory=dict)  # step → bytes staged at once for this weight
    chunk_row: int = 0  # bytes of one row when every staged use may stream it in row chunks, else 0


def _use_bytes(node: Node, kind: OpKind | None, t: Tensor, nbytes: int) -> tuple[int, int]:
    """(bytes staged at once, bytes read per token) for ``t`` read by ``node``."""
    if kind is OpKind.MOE and node.get("n_experts") and node.get("top_k"):
        n, k = int(node.get("n_experts")), int(node.get("top_k"))
        one = nbytes // max(n, 1)
        return k * one, k * one
    if kind is OpKind.INDEX and t.shape and isinstance(t.shape[0], int) and t.shape[0] > 0:
        return (0 if node.op == "Embedding" else nbytes), nbytes // t.shape[0]  # a lookup reads one row per token
    return nbytes, nbytes


def _row_chunkable(node: Node, kind: OpKind | None, t: Tensor) -> bool:
    """Whether ``node`` can read ``t`` in chunks of rows: an Embedding (rows by id) or a MatMul over [N, K]."""
    if len(t.shape) != 2:
        return False
    if kind is OpKind.INDEX:
        return node.op == "Embedding"
    return node.op == "MatMul" and bool(node.get("transpose_b", False))


def weight_uses(graph: Graph, order: Sequence[Node], registry: Registry | None = None) -> dict[str, WeightUse]:
    """Every weight reference read by ``order``, in order of first use."""
    reg = registry if registry is not None else default_registry()
    uses: dict[str, WeightUse] = {}
    for step, node in enumerate(order):
        schema = reg.find(node.op, node.version)
        kind = schema.kind if schema is not None else None
        for v in node.inputs:
            t = graph.tensor_map.get(v) if v else None
            if t is None or not t.is_weight:
                continue
            if any(isinstance(d, str) for d in t.shape):
                raise PlannerError(f"weight {t.name!r} has a symbolic shape {list(t.shape)}; weights need static "
                                   "shapes to be planned")
            ref = str(t.weight) if t.weight is not None else t.name
            nbytes = tensor_nbytes(t.dtype, t.shape)
            fresh = ref not in uses
            u = uses.setdefault(ref, WeightUse(ref, nbytes, group_of(t), step, t.weight is not None))
            chunkable = _row_chunkable(node, kind, t)
            if fresh or u.chunk_row:
                u.chunk_row = tensor_nbytes(t.dtype, t.shape[1:]) if chunkable else 0
            staged, per_token = _use_bytes(node, kind, t, nbytes)
            u.staged[step] = max(u.staged.get(step, 0), staged)
            u.per_token += per_token
    return uses


def page_round(n: int) -> int:
    return -(-n // PAGE) * PAGE


def staging_unit(streamed: Iterable[WeightUse], unit: str) -> int:
    """Bytes one staging buffer needs for the streamed weights: the largest step, or the largest layer."""
    per: dict[object, int] = {}
    chunked: list[WeightUse] = []
    for u in streamed:
        if unit == "layer":
            per[u.group] = per.get(u.group, 0) + page_round(max(u.staged.values()))
        elif u.chunk_row:
            chunked.append(u)
        else:
            for step, nbytes in u.staged.items():
                if nbytes:
                    per[step] = per.get(step, 0) + page_round(nbytes)
    base = max(per.values(), default=0)
    for u in chunked:  # cut into row chunks of at most one buffer (a chunk's read window may straddle a page)
        whole = page_round(max(u.staged.values()))
        if not whole:
            continue
        want = whole if whole <= base else max(base, min(whole, CHUNK_MIN))
        base = max(base, want, page_round(u.chunk_row) + PAGE)
    return base


# --- the rule -----------------------------------------------------------------------------------------------
def pin_priority(groups: Sequence[str], pin_layers: int) -> list[str]:
    """Pin candidates, most valuable first: globals, embeddings, lm_head, the first ``pin_layers`` layers."""
    trunk = [g for g in groups if is_trunk(g)][:pin_layers]
    globals_ = [g for g in groups if not is_trunk(g) and g not in (EMBED, LM_HEAD)]
    return [*globals_, *(g for g in (EMBED, LM_HEAD) if g in groups), *trunk]


def drop_order(candidates: Sequence[str]) -> list[str]:
    """The order pins are given up in: trunk layers (last first), then lm_head, then embed, then the globals."""
    trunk = [g for g in candidates if is_trunk(g)][::-1]
    rest = [g for g in candidates if not is_trunk(g)]
    ranked = sorted(rest, key=lambda g: {LM_HEAD: 0, EMBED: 1}.get(g, 2))
    return [*trunk, *ranked]


@dataclass(frozen=True)
class _Fit:
    pinned: frozenset[str]
    staging: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _fit(uses: Sequence[WeightUse], pinned: frozenset[str], options: PlannerOptions, arena: int) -> _Fit:
    held = [u for u in uses if u.group in pinned or not u.streamable]
    streamed = [u for u in uses if u.group not in pinned and u.streamable]
    unit = staging_unit(streamed, options.stream_unit)
    parts = {"pinned": sum(u.nbytes for u in held), "staging": unit * options.staging_buffers,
             "kv_cache": options.kv_cache_bytes, "expert_cache": options.expert_cache_bytes, "arena": arena}
    return _Fit(pinned, unit, parts)


def choose_pins(uses: Sequence[WeightUse], options: PlannerOptions, arena: int) -> _Fit:
    """Apply the pinning rule (module doc) under ``options.budget_bytes``."""
    groups = list(dict.fromkeys(u.group for u in uses))
    candidates = pin_priority(groups, options.pin_layers)
    pinned = set(candidates)
    fit = _fit(uses, frozenset(pinned), options, arena)
    for g in drop_order(candidates):
        if fit.total <= options.budget_bytes:
            break
        trial = _fit(uses, frozenset(pinned - {g}), options, arena)
        if trial.total < fit.total:  # streaming g may need more staging than pinning it holds
            pinned.discard(g)
            fit = trial
    if fit.total > options.budget_bytes:
        raise _budget_error(uses, fit, options)
    if options.fill_pins:
        for g in groups:
            if g in pinned:
                continue
            trial = _fit(uses, frozenset(pinned | {g}), options, arena)
            if trial.total <= options.budget_bytes:
                pinned.add(g)
                fit = trial
    return fit


def _budget_error(uses: Sequence[WeightUse], fit: _Fit, options: PlannerOptions) -> BudgetError:
    streamed = [u for u in uses if u.group not in fit.pinned and u.streamable]
    whole = [u for u in streamed if not u.chunk_row] or streamed  # row-chunked tensors do not size the buffers
    biggest = max(whole, key=lambda u: max(u.staged.values()), default=None)
    p = fit.parts
    detail = (f"{options.staging_buffers} staging buffers x {fit.staging} bytes = {p['staging']} + arena "
              f"{p['arena']} + KV cache {p['kv_cache']}")
    if p["expert_cache"]:
        detail += f" + expert cache {p['expert_cache']}"
    if p["pinned"]:
        detail += f" + pinned weights {p['pinned']} (caller-held, or cheaper pinned than streamed)"
    hint = (f"; the largest streamed tensor staged whole is {biggest.ref!r} ({biggest.nbytes} bytes)"
            if biggest else "")
    return BudgetError(f"memory budget of {options.budget_bytes} bytes is too small: the smallest plan needs "
                       f"{detail} = {fit.total} bytes{hint}",
                       budget_bytes=options.budget_bytes, required_bytes=fit.total, parts=fit.parts)


def plan_storage(graph: Graph, order: Sequence[Node], arena: ArenaLayout, options: PlannerOptions,
                 registry: Registry | None = None) -> StoragePlan:
    """The storage plan of ``graph`` executed in ``order`` with ``arena`` (see the module doc)."""
    uses = list(weight_uses(graph, order, registry).values())
    if options.budget_bytes == 0:
        weights = tuple(WeightPlacement(u.ref, u.nbytes, u.group, "mmap" if u.streamable else "pinned")
                        for u in uses)
        return StoragePlan(budget_bytes=0, weights=weights,
                           prefetch_order=tuple(u.ref for u in uses if u.streamable),
                           expert_cache_bytes=options.expert_cache_bytes, kv_cache_bytes=options.kv_cache_bytes)
    fit = choose_pins(uses, options, arena.size)

    def mode(u: WeightUse) -> str:
        return "pinned" if u.group in fit.pinned or not u.streamable else "streamed"

    streamed = [u for u in uses if mode(u) == "streamed"]
    return StoragePlan(
        budget_bytes=options.budget_bytes,
        weights=tuple(WeightPlacement(u.ref, u.nbytes, u.group, mode(u)) for u in uses),
        staging_buffers=(fit.staging,) * options.staging_buffers if streamed else (),
        prefetch_order=tuple(u.ref for u in streamed),
        expert_cache_bytes=options.expert_cache_bytes, kv_cache_bytes=options.kv_cache_bytes,
        streamed_bytes_per_token=sum(u.per_token for u in streamed))


def summarize(plan: ExecutionPlan) -> dict[str, Any]:
    """The storage side of a plan as plain data (the ``uaii plan --json`` output)."""
    s = plan.storage
    groups: dict[str, dict[str, Any]] = {}
    for w in s.weights:
        g = groups.setdefault(w.group, {"group": w.group, "bytes": 0, "mode": w.mode})
        g["bytes"] += w.nbytes
        if g["mode"] != w.mode:
            g["mode"] = "mixed"
    mapped = sum(w.nbytes for w in s.weights if w.mode == "mmap")
    total = s.pinned_bytes + s.staging_bytes + s.kv_cache_bytes + s.expert_cache_bytes + plan.arena.size
    return {
        "budget_bytes": s.budget_bytes, "pinned_bytes": s.pinned_bytes, "staging_bytes": s.staging_bytes,
        "streamed_bytes_per_token": s.streamed_bytes_per_token, "groups": list(groups.values()),
        "streamed_bytes": s.streamed_bytes, "mapped_bytes": mapped, "kv_cache_bytes": s.kv_cache_bytes,
        "expert_cache_bytes": s.expert_cache_bytes, "arena_bytes": plan.arena.size, "total_bytes": total,
        "staging_buffers": list(s.staging_buffers), "steps": len(plan.steps),
    }


__all__ = ["CHUNK_MIN", "EMBED", "LM_HEAD", "NORM", "OTHER", "PAGE", "WEIGHT_GROUP_RULES", "WeightUse",
           "choose_pins", "drop_order", "group_of", "is_trunk", "page_round", "pin_priority", "plan_storage",
           "staging_unit", "summarize", "weight_group", "weight_uses"]
