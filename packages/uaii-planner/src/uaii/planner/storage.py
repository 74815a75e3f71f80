"""The storage plan: which weights stay pinned, which stream through staging buffers, and in what order.

Weights are grouped by layer (:func:`weight_group`). With a budget, the pin candidates are, in priority order: the
small vectors of every group (1-D weights of at most ``pin_small_bytes`` each: norm scales, biases; pinned as one
unit, :data:`SMALL`), small globals (final norm, rope factors: read every token), the embeddings, lm_head and the
first ``pin_layers`` trunk layers. While pins + staging buffers + KV cache + expert cache + arena exceed the budget,
pins are dropped: the trunk layers (last first), then lm_head, then the embeddings, then the globals, then the small
weights. Staging is recomputed exactly for every candidate set: dropping a pin can enlarge the largest streamed
step, and a drop that would not lower the total is skipped (that weight is cheaper pinned than streamed). If even
the smallest plan does not fit, a :class:`BudgetError` names every number. With ``fill_pins``, further layers are
then pinned while the budget holds, then single weights, then the streamed steps are chosen again evenly spread over
the trunk (:func:`_spread_tensors`), then whole MoE layers fill what is left (:func:`_fill`). Without a budget (0)
every weight is memory-mapped and nothing is staged.

Staging: each buffer holds what one step streams at once (``stream_unit="tensor"``: a grouped MatMul needs all its
weights staged together) or one whole layer (``"layer"``), every tensor rounded up to a page as the staging pool
allocates it (a row-chunkable weight staged whole: its read window at any offset, :func:`window_bytes`); with
``read_ahead`` the buffers grow to read through the longest pinned run (:func:`read_ahead_bytes`). A tied
embedding/lm_head table is one weight reference, counted once. Streamed MoE expert banks stage nothing: the runtime
reads the routed top_k experts straight into the expert cache, whose part of the budget is ``expert_cache_bytes``
but at least one expert of every bank of a MoE step (:func:`expert_cache_need`; 0 when every bank is pinned). With
``fill_pins`` and ``expert_cache_bytes`` 0 (auto) the cache takes what the budget leaves once the dense weights are
pinned (:func:`auto_expert_cache`), and no MoE layer is pinned whole: a layer's banks pinned save its top_k experts
per token, and the same bytes as cache save as much when routing is uniform (an expert of any streamed layer, hit at
the cache's share of that layer's experts) and more when it is not. The plan's ``expert_cache_bytes`` is that
figure.

What a step stages and reads per token follows from how its op reads each weight, which the op's schema declares
(:class:`uaii.ir.ops.WeightAccess`, :meth:`~uaii.ir.ops.OpSchema.weight_inputs`); no op name or input slot is
special here. ``WHOLE`` stages the tensor. ``EXPERTS`` stages nothing (above) and reads ``top_k`` experts per token.
``ROWS`` (an Embedding or Gather table) reads only its rows (``pread`` of each row, outside the staging pool: it
stages nothing). ``ROW_CHUNKS`` (a MatMul weight stored [N, K], such as the lm_head) is *row-chunkable*: the
executor streams it in chunks of whole rows that fit one staging buffer. In ``"tensor"`` mode a row-chunkable
tensor therefore never sizes the staging buffers beyond the largest unchunkable step (or :data:`CHUNK_MIN` when
nothing else streams), so a large tied table can stream instead of being pinned.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from uaii.ir.dtype import tensor_nbytes
from uaii.ir.graph import Graph, Node, Tensor
from uaii.ir.ops.access import WeightAccess, WeightInput
from uaii.ir.plan import ArenaLayout, ExecutionPlan, StoragePlan, WeightPlacement
from uaii.ir.registry import Registry, default_registry
from uaii.planner.errors import BudgetError, PlannerError
from uaii.planner.options import PlannerOptions

PAGE = 4096
"""The staging pool hands out page-multiple extents."""
CHUNK_MIN = 1 << 20
"""Smallest staging buffer a row-chunked tensor is cut for (when no unchunkable step needs more)."""

EMBED, LM_HEAD, NORM, OTHER = "embed", "lm_head", "norm", "other"
SMALL = "small"
"""The pin unit of the 1-D weights of at most ``pin_small_bytes`` each, whatever their group (a streamed norm scale
of a few KiB would cost a staging page, an I/O request and a read-ahead slot of its own every token)."""

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
    vector: bool = False  # a 1-D weight (norm scale, bias)
    expert: int = 0  # an expert bank read by experts into the expert cache: cache bytes of one of its experts


def _use_bytes(access: WeightAccess, t: Tensor, nbytes: int, top_k: int) -> tuple[int, int]:
    """(bytes staged at once, bytes read per token) for ``t`` read with ``access``. An expert bank stages nothing:
    the ``top_k`` experts of its axis 0 are read straight into the expert cache (see :func:`expert_cache_need`); a
    table read by rows stages nothing either and reads one row per token."""
    rows = int(t.shape[0]) if t.shape else 0
    if access is WeightAccess.EXPERTS and rows:
        return 0, min(top_k, rows) * (nbytes // rows)
    if access is WeightAccess.ROWS and rows:
        return 0, nbytes // rows
    return nbytes, nbytes


def _row_chunkable(access: WeightAccess, t: Tensor) -> bool:
    """Whether the use can read the 2-D ``t`` in chunks of whole rows (by id, or chunks of output features)."""
    return len(t.shape) == 2 and access in (WeightAccess.ROWS, WeightAccess.ROW_CHUNKS)


def weight_uses(graph: Graph, order: Sequence[Node], registry: Registry | None = None) -> dict[str, WeightUse]:
    """Every weight reference read by ``order``, in order of first use."""
    reg = registry if registry is not None else default_registry()
    uses: dict[str, WeightUse] = {}
    tmap = graph.tensor_map
    weights = {t.name for t in graph.tensors if t.is_weight}
    for step, node in enumerate(order):
        schema = reg.find(node.op, node.version)
        reads = (schema.weight_inputs(node, weights) if schema is not None
                 else [WeightInput(i, v, WeightAccess.WHOLE) for i, v in enumerate(node.inputs) if v in weights])
        top_k = int(node.get("top_k") or 1)  # read only for EXPERTS, whose ops declare top_k (uaii.ir.ops.access)
        for _, v, access in reads:
            t = tmap[v]
            if any(isinstance(d, str) for d in t.shape):
                raise PlannerError(f"weight {t.name!r} has a symbolic shape {list(t.shape)}; weights need static "
                                   "shapes to be planned")
            ref = str(t.weight) if t.weight is not None else t.name
            nbytes = tensor_nbytes(t.dtype, t.shape)
            fresh = ref not in uses
            u = uses.setdefault(ref, WeightUse(ref, nbytes, group_of(t), step, t.weight is not None,
                                               vector=len(t.shape) <= 1))
            chunkable = _row_chunkable(access, t)
            if fresh or u.chunk_row:
                u.chunk_row = tensor_nbytes(t.dtype, t.shape[1:]) if chunkable else 0
            staged, per_token = _use_bytes(access, t, nbytes, top_k)
            if access is WeightAccess.EXPERTS and t.shape:
                # a read window of one expert may straddle a page more, and the runtime allows one page beyond it
                u.expert = page_round(nbytes // max(int(t.shape[0]), 1)) + 2 * PAGE
            u.staged[step] = max(u.staged.get(step, 0), staged)
            u.per_token += per_token
    return uses


def page_round(n: int) -> int:
    return -(-n // PAGE) * PAGE


def window_bytes(n: int) -> int:
    """The most pages a read of ``n`` bytes at any file offset covers, in bytes (O_DIRECT reads whole pages)."""
    return page_round(n + PAGE - 1) if n else 0


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
        staged = max(u.staged.values())
        if not staged:
            continue
        # staged whole, its read window at any offset: one page more than its bytes rounded would leave the runtime
        # a last chunk of a few rows (a read and a staging extent of their own for a page of data)
        whole = window_bytes(staged)
        want = whole if whole <= base else max(base, min(whole, CHUNK_MIN))
        base = max(base, want, page_round(u.chunk_row) + PAGE)
    return base


def expert_cache_need(streamed: Iterable[WeightUse]) -> int:
    """The smallest expert cache for the streamed expert banks: one expert of every bank of a MoE step (the
    runtime reads an expert's gate, up and down weights together), the largest step; 0 when no bank streams."""
    per: dict[int, int] = {}
    for u in streamed:
        if u.expert:
            for step in u.staged:
                per[step] = per.get(step, 0) + u.expert
    return max(per.values(), default=0)


def read_ahead_bytes(uses: Sequence[WeightUse], streamed: Collection[WeightUse], pool: int, ratio: float) -> int:
    """What the disk reads, at the pace of the streamed bytes, while the longest run of pinned weights computes
    (``uses`` in first-use order, the run taken around the end of a pass into the next; a weight's bytes per token
    stand for its compute time): the run's share ``g`` of a pass times the streamed bytes per token ``B0`` of the
    same plan with a ``pool`` of staging (its staging buffers without read-ahead), and at most ``ratio`` times the
    run's bytes (a disk reads at most that fraction of what the memory-bound products read in the same time: a pass
    bound by its reads computes the run faster than the reads' pace, and a larger pool would only stream more).

    Why: a streamed weight is read into the staging pool while the weights before it compute. Through a long pinned
    run (a pinned lm_head, a tied embedding table: half of a small model's decode pass) the disk can only fill the
    pool; a pool of two steps fills early and the disk idles for the rest of the run, so the pass waits for the
    reads after it. A pool of ``g x B0`` keeps the disk reading through the run at the pace of the rest of the
    pass. Every byte the pool grows is a byte less pinned, so the plan that has such a pool streams ``B = B0 + W -
    pool`` bytes; ``W = g x B0`` is then ``g x (B - pool) / (1 - g)`` solved for what this plan streams, not a
    pool that grows with the bytes it makes stream (which would not stop)."""
    total = sum(u.per_token for u in uses)
    rate = sum(u.per_token for u in streamed)
    if not rate or not total:
        return 0
    ids = {id(u) for u in streamed}
    longest, run, first = 0, 0, None
    for u in uses:
        if id(u) in ids:
            first = run if first is None else first
            longest, run = max(longest, run), 0
        else:
            run += u.per_token
    longest = max(longest, run + (first or 0))  # the run that wraps around from the end of a pass into the next
    # B0 = B - (W - pool) and W = g B0, with g = longest / total: W = g (B + pool) / (1 + g)
    return min(-(-longest * (rate + pool) // (total + longest)), int(longest * ratio))


def staging_pool(uses: Sequence[WeightUse], streamed: Sequence[WeightUse], options: PlannerOptions) -> tuple[int, ...]:
    """The staging buffers when ``streamed`` (of ``uses``, in first-use order) stream: ``staging_buffers`` of
    :func:`staging_unit` bytes each, larger with ``read_ahead`` when together they would hold less than
    :func:`read_ahead_bytes`; none when nothing is staged."""
    unit = staging_unit(streamed, options.stream_unit)
    if not unit or not streamed:
        return ()
    n = options.staging_buffers
    if options.read_ahead:
        unit = max(unit, page_round(-(-read_ahead_bytes(uses, streamed, unit * n, options.read_ahead) // n)))
    return (unit,) * n


# --- the rule -----------------------------------------------------------------------------------------------
def pin_priority(groups: Sequence[str], pin_layers: int) -> list[str]:
    """Pin candidates, most valuable first: small weights, globals, embeddings, lm_head, the first ``pin_layers``
    layers."""
    trunk = [g for g in groups if is_trunk(g)][:pin_layers]
    globals_ = [g for g in groups if not is_trunk(g) and g not in (EMBED, LM_HEAD, SMALL)]
    return [*(g for g in (SMALL,) if g in groups), *globals_, *(g for g in (EMBED, LM_HEAD) if g in groups),
            *trunk]


def drop_order(candidates: Sequence[str]) -> list[str]:
    """The order pins are given up in: trunk layers (last first), then lm_head, then embed, then the globals, then
    the small weights."""
    trunk = [g for g in candidates if is_trunk(g)][::-1]
    rest = [g for g in candidates if not is_trunk(g)]
    ranked = sorted(rest, key=lambda g: {LM_HEAD: 0, EMBED: 1, SMALL: 3}.get(g, 2))
    return [*trunk, *ranked]


def _held(u: WeightUse, pinned: Collection[str], options: PlannerOptions) -> bool:
    """Whether ``u`` stays in memory with the pin units ``pinned`` (group names, SMALL, or single references)."""
    return not u.streamable or pin_unit(u, options) in pinned or u.ref in pinned


def pin_unit(u: WeightUse, options: PlannerOptions) -> str:
    """What ``u`` is pinned and dropped with: :data:`SMALL` for a small streamable vector, else its group."""
    return SMALL if u.vector and u.streamable and u.nbytes <= options.pin_small_bytes else u.group


@dataclass(frozen=True)
class _Fit:
    pinned: frozenset[str]
    staging: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def _fit(uses: Sequence[WeightUse], pinned: frozenset[str], options: PlannerOptions, arena: int,
         expert_floor: int = 0) -> _Fit:
    """The parts of the budget a pin set needs. ``expert_floor``: count at least that much expert cache whatever
    streams (the fixed cost of streaming any expert bank, taken as paid while comparing drops)."""
    held: list[WeightUse] = []
    streamed: list[WeightUse] = []
    for u in uses:  # one pass: the greedy pin search calls this for every candidate
        (held if _held(u, pinned, options) else streamed).append(u)
    buffers = staging_pool(uses, streamed, options)
    experts = expert_cache_need(streamed)  # expert banks are read into the expert cache, never staged
    cache = max(options.expert_cache_bytes, experts) if experts else 0
    parts = {"pinned": sum(u.nbytes for u in held), "staging": sum(buffers),
             "kv_cache": options.kv_cache_bytes, "expert_cache": max(cache, expert_floor), "arena": arena}
    return _Fit(pinned, buffers[0] if buffers else 0, parts)


def _drop(uses: Sequence[WeightUse], candidates: Sequence[str], options: PlannerOptions, arena: int,
          expert_floor: int) -> _Fit:
    """Drop pins in :func:`drop_order` while over budget, skipping a drop that would not lower the total."""
    pinned = set(candidates)
    fit = _fit(uses, frozenset(pinned), options, arena, expert_floor)
    for g in drop_order(candidates):
        if fit.total <= options.budget_bytes:
            break
        trial = _fit(uses, frozenset(pinned - {g}), options, arena, expert_floor)
        if trial.total < fit.total:  # streaming g may need more staging than pinning it holds
            pinned.discard(g)
            fit = trial
    return _fit(uses, frozenset(pinned), options, arena)


def choose_pins(uses: Sequence[WeightUse], options: PlannerOptions, arena: int) -> _Fit:
    """Apply the pinning rule (module doc) under ``options.budget_bytes``.

    The expert cache is a fixed cost that the first streamed expert bank brings in: dropping one layer of a MoE
    model may cost more than it saves, while dropping several saves. When the plain rule ends over budget, it runs
    again with that cost counted from the start (the cache of every streamable bank), and the smaller plan wins."""
    groups = list(dict.fromkeys(pin_unit(u, options) for u in uses))
    candidates = pin_priority(groups, options.pin_layers)
    fit = _drop(uses, candidates, options, arena, 0)
    floor = expert_cache_need(u for u in uses if u.streamable)
    if fit.total > options.budget_bytes and floor:
        paid = _drop(uses, candidates, options, arena, max(floor, options.expert_cache_bytes))
        fit = min(fit, paid, key=lambda f: f.total)
    if fit.total > options.budget_bytes:
        raise _budget_error(uses, fit, options)
    pinned = set(fit.pinned)
    if options.fill_pins:
        fit = _fill(uses, groups, pinned, fit, options, arena)
    return fit


SPREAD_FLOOR = 2
"""Steps that stage less than 1/SPREAD_FLOOR of the largest trunk step keep the modes the pinning rule gave them in
the even spread (:func:`_spread_tensors`): a few large reads keep a disk busier than many small ones, and the staging
pool stays sized for the large step."""
SPREAD_SLACK = 1.05
"""The even spread may stream up to this factor more bytes per token than the set it replaces, in a plan that streams
at most :data:`SPREAD_SHARE` of a pass's bytes; more streamed, it may not stream more (a pass bound by its reads
gains nothing from an even spread: the disk is behind all the time)."""
SPREAD_SHARE = 0.25


def _fill(uses: Sequence[WeightUse], groups: Sequence[str], pinned: set[str], fit: _Fit, options: PlannerOptions,
          arena: int) -> _Fit:
    """``fill_pins``: pin further groups while the budget holds (trunk layers in execution order), then single
    weights (:func:`_fill_tensors`), then choose again which trunk weights stream so that they are evenly spread over
    the trunk (:func:`_spread_tensors`).

    With the auto expert cache (``expert_cache_bytes`` 0) the rest is the cache's (:func:`auto_expert_cache`) and no
    group with MoE expert banks is pinned; with an explicit cache such groups come last, whole: pinning such a layer
    saves only top_k / n_experts of its banks' bytes per token, where a dense weight pinned saves all of its bytes, so
    the dense weights of every layer are pinned before any bank."""
    moe = {u.group for u in uses if u.expert}
    for g in groups:
        if g in pinned or g in moe:
            continue
        trial = _fit(uses, frozenset(pinned | {g}), options, arena)
        if trial.total <= options.budget_bytes:
            pinned.add(g)
            fit = trial
    fit = _spread_tensors(uses, moe, _fill_tensors(uses, fit, options, arena), options, arena)
    if fit.parts["expert_cache"] and not options.expert_cache_bytes:  # auto: the cache takes the rest (module doc)
        cache = auto_expert_cache(options, fit.parts["pinned"], fit.parts["staging"], arena, fit.parts["expert_cache"])
        return _Fit(fit.pinned, fit.staging, {**fit.parts, "expert_cache": cache})
    for g in groups:
        if g in moe and g not in fit.pinned:
            trial = _fit(uses, fit.pinned | {g}, options, arena)
            if trial.total <= options.budget_bytes:
                fit = trial
    return fit


def even_pick(trunk: Sequence[WeightUse], units: Sequence[Sequence[str]], target: int) -> set[str]:
    """The references of the ``units`` (weights staged together) to stream so that about ``target`` bytes stream,
    evenly over ``trunk`` (its weights in execution order). A weight's bytes stand for the time it takes to compute
    (a decode pass reads every weight once), and a unit is picked when the bytes picked so far fall half of it
    behind the even share of the trunk computed until its end (error diffusion): the picked bytes then track a
    straight line through the pass."""
    span = sum(u.nbytes for u in trunk)
    rate = target / span if span else 0.0
    size = {u.ref: u.nbytes for u in trunk}
    last = {unit[-1]: unit for unit in units}  # a unit is computed when its last weight is
    done = picked = 0
    chosen: set[str] = set()
    for u in trunk:
        done += u.nbytes
        unit = last.get(u.ref)
        if unit is None:
            continue
        nbytes = sum(size[r] for r in unit)
        if picked + nbytes / 2 <= rate * done:
            chosen.update(unit)
            picked += nbytes
    return chosen


def _spread_tensors(uses: Sequence[WeightUse], moe: Collection[str], fit: _Fit, options: PlannerOptions,
                    arena: int) -> _Fit:
    """The plan with the same budget whose streamed trunk weights are spread evenly over the trunk (:func:`even_pick`),
    or ``fit`` itself when no such plan streams at most :data:`SPREAD_SLACK` times its bytes (its bytes when it
    streams more than :data:`SPREAD_SHARE` of a pass).

    Why: a streamed weight is read while the pinned weights before it compute, at most a staging pool ahead. Whole
    layers left streaming in a lump (the last layers, or the ones a layer-by-layer fill could not pin) are read only
    while they and their neighbours compute, so the disk idles through the rest of the pass and the pass waits for
    it at the lump; weights spread evenly keep the disk reading through the whole trunk. The spread moves whole
    steps (the weights a step stages together, e.g. a grouped gate/up) of at least 1/:data:`SPREAD_FLOOR` of the
    largest; expert banks, the weights of MoE layers (the groups ``moe``) and weights a step reads only in part
    (rows, experts) keep the modes the pinning rule gave them."""
    trunk = [u for u in uses if is_trunk(u.group)]
    by_step: dict[tuple[str, tuple[int, ...]], list[WeightUse]] = {}
    for u in trunk:
        if u.streamable and u.group not in moe and pin_unit(u, options) != SMALL and u.per_token >= u.nbytes:
            by_step.setdefault((u.group, tuple(sorted(u.staged))), []).append(u)
    if not by_step:
        return fit
    floor = max(sum(u.nbytes for u in unit) for unit in by_step.values()) / SPREAD_FLOOR
    units = [[u.ref for u in unit] for unit in by_step.values() if sum(u.nbytes for u in unit) >= floor]
    movable = {u.ref: u for unit in by_step.values() for u in unit}  # the smaller steps' weights: pinned
    held = {u.ref for u in uses if _held(u, fit.pinned, options)}
    need = sum(u.nbytes for u in movable.values() if u.ref not in held)
    if not need or need >= sum(u.nbytes for unit in units for u in map(movable.__getitem__, unit)):
        return fit
    # the same pins, by reference in the trunk, without the movable weights
    keep = {p for p in fit.pinned if not is_trunk(p) and p not in movable}
    keep |= {u.ref for u in trunk if u.ref in held and u.ref not in movable}
    share = sum(u.per_token for u in uses if u.ref not in held) / max(sum(u.per_token for u in uses), 1)
    limit = need * SPREAD_SLACK if share <= SPREAD_SHARE else need
    target, best, best_streamed, tried = need, None, 0, set()
    for _ in range(12):
        chosen = even_pick(trunk, units, target)
        streamed = sum(movable[r].nbytes for r in chosen)
        if streamed > limit or streamed in tried:
            break
        tried.add(streamed)
        trial = _fit(uses, frozenset(keep | (movable.keys() - chosen)), options, arena)
        over = trial.total - options.budget_bytes
        if over > 0:
            if best is not None:
                break  # streaming less than the best plan does not fit
            target = streamed + over  # what still does not fit streams too
            continue
        if best is None or streamed < best_streamed:
            best, best_streamed = trial, streamed
        target = streamed + over  # what the budget still holds is pinned
    return best if best is not None else fit


def _fill_tensors(uses: Sequence[WeightUse], fit: _Fit, options: PlannerOptions, arena: int) -> _Fit:
    """Spend what whole groups left of the budget (up to a layer's size) on single streamed weights, largest
    first: each pinned weight is read no more. The embedding and lm_head tables stay group decisions, and so do MoE
    expert banks: a MoE step reads the experts of all its banks through the expert cache, so a bank pinned alone
    would still be read (and would save only top_k / n_experts of its bytes per token)."""
    pinned = set(fit.pinned)
    budget = options.budget_bytes
    todo = sorted((u for u in uses if not _held(u, pinned, options) and u.group not in (EMBED, LM_HEAD)
                   and not u.expert and u.per_token >= u.nbytes), key=lambda u: (-u.nbytes, u.first_use))
    for u in todo:
        if u.nbytes > budget - fit.total + fit.parts["staging"] + fit.parts["expert_cache"]:
            continue  # cannot fit even if pinning it freed every staging and expert cache byte
        trial = _fit(uses, frozenset(pinned | {u.ref}), options, arena)
        if trial.total <= budget:
            pinned.add(u.ref)
            fit = trial
    return fit


def _budget_error(uses: Sequence[WeightUse], fit: _Fit, options: PlannerOptions) -> BudgetError:
    streamed = [u for u in uses if not _held(u, fit.pinned, options)]
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
    return storage_for_uses(list(weight_uses(graph, order, registry).values()), arena, options)


def storage_for_uses(uses: Sequence[WeightUse], arena: ArenaLayout, options: PlannerOptions) -> StoragePlan:
    """:func:`plan_storage` of the weights ``uses`` (:func:`weight_uses`, in first-use order): the pinning rule
    chooses the modes, :func:`storage_for_modes` the rest."""
    if options.budget_bytes == 0:
        return storage_for_modes(uses, ["mmap" if u.streamable else "pinned" for u in uses], options)
    fit = choose_pins(uses, options, arena.size)
    return storage_for_modes(uses, ["pinned" if _held(u, fit.pinned, options) else "streamed" for u in uses], options,
                             arena.size)


def auto_expert_cache(options: PlannerOptions, pinned: int, staging: int, arena: int, need: int) -> int:
    """The expert cache of ``fill_pins`` with ``expert_cache_bytes`` 0: what the budget leaves after the pinned
    weights, the staging buffers, the KV cache and the arena, at least ``need`` (one expert of every bank of a MoE
    step, :func:`expert_cache_need`)."""
    return max(need, options.budget_bytes - pinned - staging - options.kv_cache_bytes - arena)


def storage_for_modes(uses: Sequence[WeightUse], modes: Sequence[str], options: PlannerOptions,
                      arena_bytes: int = 0) -> StoragePlan:
    """The storage plan that places ``uses`` in ``modes`` (one each): prefetch order, staging buffers, expert cache
    and bytes per token follow from the modes (and, for the auto expert cache, the ``arena_bytes`` the budget also
    holds). The planner makes its plans with it, and the check of a cached plan (:mod:`uaii.planner.check`)
    compares with it, so the two cannot drift apart. Without a budget every streamable weight is in the prefetch
    order (memory-mapped, read ahead) and nothing is staged."""
    weights = tuple(WeightPlacement(u.ref, u.nbytes, u.group, m) for u, m in zip(uses, modes, strict=True))
    if options.budget_bytes == 0:
        return StoragePlan(budget_bytes=0, weights=weights, prefetch_order=tuple(u.ref for u in uses if u.streamable),
                           expert_cache_bytes=options.expert_cache_bytes, kv_cache_bytes=options.kv_cache_bytes)
    streamed = [u for u, m in zip(uses, modes, strict=True) if m == "streamed"]
    buffers = staging_pool(uses, streamed, options)
    experts = expert_cache_need(streamed)  # as :func:`_fit` counts it
    cache = max(options.expert_cache_bytes, experts) if experts else 0
    if cache and options.fill_pins and not options.expert_cache_bytes:
        pinned = sum(w.nbytes for w in weights if w.mode == "pinned")
        cache = auto_expert_cache(options, pinned, sum(buffers), arena_bytes, experts)
    return StoragePlan(
        budget_bytes=options.budget_bytes, weights=weights, staging_buffers=buffers,
        prefetch_order=tuple(u.ref for u in streamed),
        expert_cache_bytes=cache,
        kv_cache_bytes=options.kv_cache_bytes, streamed_bytes_per_token=sum(u.per_token for u in streamed))


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
    total = plan.planned_bytes
    return {
        "budget_bytes": s.budget_bytes, "pinned_bytes": s.pinned_bytes, "staging_bytes": s.staging_bytes,
        "streamed_bytes_per_token": s.streamed_bytes_per_token, "groups": list(groups.values()),
        "streamed_bytes": s.streamed_bytes, "mapped_bytes": mapped, "kv_cache_bytes": s.kv_cache_bytes,
        "expert_cache_bytes": s.expert_cache_bytes, "arena_bytes": plan.arena.size, "total_bytes": total,
        "staging_buffers": list(s.staging_buffers), "steps": len(plan.steps),
    }


__all__ = ["CHUNK_MIN", "EMBED", "LM_HEAD", "NORM", "OTHER", "PAGE", "SMALL", "WEIGHT_GROUP_RULES", "WeightUse",
           "auto_expert_cache", "choose_pins", "drop_order", "even_pick", "expert_cache_need", "group_of", "is_trunk",
           "page_round", "pin_priority", "pin_unit", "plan_storage", "read_ahead_bytes", "staging_pool", "staging_unit",
           "storage_for_modes", "storage_for_uses", "summarize", "weight_group", "weight_uses", "window_bytes"]
