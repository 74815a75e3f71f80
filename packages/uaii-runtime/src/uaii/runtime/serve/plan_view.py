"""The dashboard's numbers about a model before it is loaded: what it is (architecture, size, quant mix) and the
memory plan a session would make for it at a given budget — the picture of which layers stay pinned and which
stream, against the budget line.

Planning here is what :class:`~uaii.runtime.session.Session` does up to the plan and no further: the model's header
and tensor table are read (:func:`~uaii.runtime.model.load_bundle`; no weight is read), the decoder is rewritten as
the Session rewrites it, and :func:`~uaii.runtime.planning.session_plan` plans it for the backend the options
select. Nothing is compiled or mapped, so a what-if budget costs a plan (a plan-cache hit after the first time)
and never the memory of a load. The figures are the planner's, as ``uaii plan`` prints them; a Session may replan
once with less when its backend allocates more than the plan counts (:func:`~uaii.runtime.planning.replan`).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uaii.ir import UaiiError
from uaii.runtime.bounds import ContextBounds
from uaii.runtime.model import ModelBundle, load_bundle
from uaii.runtime.options import SessionOptions
from uaii.runtime.planning import kv_slots, session_plan
from uaii.runtime.rewrite import last_token_logits

_LAYER = re.compile(r"^blk\.(\d+)$")
MODES = ("pinned", "streamed", "mmap")
BUNDLES_KEPT = 4  # parsed model headers kept between requests (a slider drag re-plans the same model)

_bundles: OrderedDict[tuple[str, int, int], ModelBundle] = OrderedDict()
_backends: dict[str, Any] = {}
_lock = threading.Lock()


def bundle_of(path: Path) -> ModelBundle:
    """The parsed model at ``path`` (header, tensor table, graph, tokenizer), kept while the file is unchanged:
    re-planning the same model for another budget then costs only the plan."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _bundles.get(key)
        if hit is not None:
            _bundles.move_to_end(key)
            return hit
    bundle = load_bundle(path)
    with _lock:
        _bundles[key] = bundle
        while len(_bundles) > BUNDLES_KEPT:
            _bundles.popitem(last=False)
    return bundle


def backend_for(device: str) -> Any:
    """The backend ``device`` selects (probed once per device name: ``auto`` probes the GPU backends)."""
    from uaii.backends import select_device

    with _lock:
        backend = _backends.get(device)
    if backend is None:
        backend = select_device(device)
        with _lock:
            _backends[device] = backend
    return backend


# ------------------------------------------------------------------------------------------------ the model
def model_facts(bundle: ModelBundle) -> dict[str, Any]:
    """Architecture, parameters, weight bytes and the quant mix (type → tensors, bytes) of a parsed model."""
    info = bundle.info
    return {"architecture": info.arch if info else None, "format": bundle.format,
            "n_params": info.n_params if info else None, "weight_bytes": info.weight_bytes if info else None,
            "n_layers": getattr(bundle.config, "n_layers", None), "context_length": bundle.context_length,
            "generative": bundle.generative, "quant_mix": quant_mix(bundle)}


def quant_mix(bundle: ModelBundle) -> dict[str, dict[str, int]]:
    """Tensor type → {count, bytes}, largest first: the file's own types where the loader read a tensor table
    (``Q4_1``, ``F32``, each byte counted once), else the IR graph's weight dtypes."""
    from uaii.runtime.cli.inspection import distinct_tensors
    from uaii.runtime.cli.inspection import quant_mix as file_mix

    infos = list(bundle.locations.values())
    if infos and all(hasattr(i, a) for i in infos for a in ("dtype", "nbytes", "shape", "file", "offset")):
        read = file_mix(distinct_tensors(bundle.locations))
        return {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in read.items()}
    mix: dict[str, dict[str, int]] = {}
    for t in bundle.info.tensors if bundle.info else ():
        row = mix.setdefault(str(t["dtype"]).upper(), {"count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += int(t["bytes"])
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))


# ------------------------------------------------------------------------------------------------- the plan
def plan_view(path: Path, options: Mapping[str, Any], budget: int, *, backend: Any = None) -> dict[str, Any]:
    """The memory plan of the model at ``path`` for a Session with ``options`` (its keyword options, as the
    server opens sessions with) under ``budget`` bytes (0: unlimited): the totals that count against the budget,
    and one row per weight group (``blk.N`` in layer order under ``layers``; embeddings, lm_head, final norm under
    ``others``) with its bytes per mode. A budget that cannot hold the smallest plan is an answer too
    (``fits`` false, ``error``, and the parts the smallest plan needs); any other failure raises."""
    from uaii.planner import BudgetError

    bundle = bundle_of(path)
    opts = SessionOptions.from_kwargs({**options, "budget_bytes": int(budget)})
    bounds, opts = ContextBounds.of(bundle, opts)
    graph = last_token_logits(bundle.graph) if bundle.generative else bundle.graph
    chosen = backend if backend is not None else backend_for(opts.device)
    head = {"budget_bytes": opts.budget_bytes, "device": chosen.name, "context": bounds.context,
            "kv_slots": kv_slots(opts, bounds.context) if bundle.generative else 0, "kv_dtype": opts.kv_dtype}
    try:
        plan, hit = session_plan(graph, bundle, opts, backend=chosen, context=bounds.context,
                                 budget=opts.budget_bytes)
    except BudgetError as exc:
        parts = {k: int(v) for k, v in exc.parts.items()}
        return {**head, "fits": False, "error": str(exc), "required_bytes": int(exc.required_bytes),
                "parts": _parts(parts), "total_bytes": int(exc.required_bytes), "layers": [], "others": []}
    if plan is None:
        raise UaiiError(f"[serve] {path.name}: the planner could not plan this model (the server log says why); "
                        "a session runs it in its graph's own order, without a storage plan")
    s = plan.storage
    parts = {"pinned": s.pinned_bytes, "staging": s.staging_bytes, "kv_cache": s.kv_cache_bytes,
             "arena": plan.arena.size, "expert_cache": s.expert_cache_bytes}
    layers, others = weight_groups(s.weights)
    return {**head, "fits": True, "error": None, "cache_hit": bool(hit), "parts": _parts(parts),
            "total_bytes": plan.planned_bytes, "streamed_bytes": s.streamed_bytes,
            "mapped_bytes": sum(w.nbytes for w in s.weights if w.mode == "mmap"),
            "streamed_bytes_per_token": s.streamed_bytes_per_token, "staging_buffers": list(s.staging_buffers),
            "layers": layers, "others": others}


def budget_range(path: Path, options: Mapping[str, Any]) -> dict[str, int]:
    """The budgets worth showing for the model at ``path``: from the smallest plan that fits (what the planner
    says a 1-byte budget would need: staging, arena, KV cache and what must stay pinned) to every weight pinned
    (the weights plus the KV cache, arena and expert cache; nothing staged)."""
    view = plan_view(path, options, 1)
    low = int(view.get("required_bytes") or view["total_bytes"])
    info = bundle_of(path).info
    parts = view["parts"]
    high = (info.weight_bytes if info else 0) + parts["kv_cache"] + parts["arena"] + parts["expert_cache"]
    return {"min_bytes": low, "max_bytes": max(high, low)}


def _parts(parts: Mapping[str, int]) -> dict[str, int]:
    """What counts against the budget, in the order the picture stacks it."""
    return {k: int(parts.get(k, 0)) for k in ("pinned", "staging", "kv_cache", "arena", "expert_cache")}


def weight_groups(weights: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(``blk.N`` rows in layer order, the other groups in plan order): group, bytes, bytes per mode, and
    ``mode`` — the one mode of all its weights, or ``mixed`` (e.g. a layer's norms pinned, its matrices
    streamed)."""
    groups: dict[str, dict[str, Any]] = {}
    for w in weights:
        g = groups.setdefault(w.group, {"group": w.group, "bytes": 0, **{m: 0 for m in MODES}})
        g["bytes"] += int(w.nbytes)
        g[w.mode] += int(w.nbytes)
    for g in groups.values():
        used = [m for m in MODES if g[m]]
        g["mode"] = "mixed" if len(used) > 1 else used[0] if used else "none"
    layers = sorted((g for g in groups.values() if _LAYER.match(g["group"])),
                    key=lambda g: int(g["group"].split(".")[1]))
    others = [g for g in groups.values() if not _LAYER.match(g["group"])]
    return layers, others


__all__ = ["MODES", "backend_for", "budget_range", "bundle_of", "model_facts", "plan_view", "quant_mix",
           "weight_groups"]
