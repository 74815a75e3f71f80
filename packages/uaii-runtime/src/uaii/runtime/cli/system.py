"""``uaii devices``, ``uaii cache status|clear``, ``uaii plan``, ``uaii presets``: the machine and what UAII keeps."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rich.table import Table

from uaii.ir import UaiiError
from uaii.runtime import presets

from . import report
from .context import CliError, Context, add_model_argument, model_path, pipeline_starts


def add_parsers(sub: Any) -> None:
    d = sub.add_parser("devices", help="every backend (cpu, cuda, rocm, metal, vulkan, webgpu): available or why "
                       "not; every adapter of the backends that list them (WebGPU) with its limits")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_devices)

    c = sub.add_parser("cache", help="the on-disk plan cache: status | clear")
    c.add_argument("action", choices=("status", "clear"))
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=cmd_cache)

    p = sub.add_parser("plan", help="the storage plan a session makes for a model under a memory budget")
    add_model_argument(p)
    p.add_argument("--budget", metavar="BYTES", default=None,
                   help="memory budget, e.g. 256MiB (default: the auto preset's; 0 = unlimited)")
    p.add_argument("--preset", choices=presets.PRESET_NAMES, default=None, help="memory preset (default auto)")
    p.add_argument("--json", action="store_true", help="print the planner's summary as one JSON object")
    p.add_argument("--pipeline", type=int, default=None, metavar="K",
                   help="plan K pipeline stages instead (one per node): the split and each stage's plan")
    p.add_argument("--budget-per-node", metavar="BYTES", default=None,
                   help="each stage's budget with --pipeline (default: the preset's on this machine)")
    p.add_argument("--pipeline-starts", metavar="L1,L2,...", default=None,
                   help="the layers where stages 2..K begin (default: chosen from the budgets)")
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="tokens of KV cache each stage plans for (default: the model's context)")
    p.set_defaults(func=cmd_plan)

    s = sub.add_parser("presets", help="the memory presets and their numbers on this machine")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_presets)


# --------------------------------------------------------------------------------------------------- devices
def device_rows() -> list[dict[str, Any]]:
    from uaii.backends import list_backends

    rows = []
    for name, status in list_backends():
        rows.append({"name": name, "available": bool(status.available), "devices": list(status.devices),
                     "software": bool(status.software), "not_auto": status.not_auto,
                     "reason": "" if status.available else status.reason})
    return rows


def adapter_rows(backend: Any) -> tuple[list[dict[str, Any]], str] | None:
    """Every device ``backend`` lists (``Backend.devices``: adapters, software ones marked), or none and why (its
    SDK not installed, enumeration failed); None when the backend lists no devices. Through the backend contract:
    the CLI names no backend's modules."""
    try:
        rows = backend.devices()
    except UaiiError as exc:
        return [], str(getattr(exc, "reason", exc))
    except Exception as exc:  # a listing never takes the command down: it says why it is empty
        return [], f"adapter enumeration failed: {type(exc).__name__}: {exc}"
    return None if rows is None else (list(rows), "")


def device_listings() -> dict[str, tuple[list[dict[str, Any]], str]]:
    """Backend name → (its adapters, why none), for the backends that list devices."""
    from uaii.backends.registry import backend_names, get_backend

    out = {}
    for name in backend_names():
        listing = adapter_rows(get_backend(name))
        if listing is not None:
            out[name] = listing
    return out


def cmd_devices(args: argparse.Namespace, ctx: Context) -> int:
    rows = device_rows()
    listings = device_listings()
    if args.json:
        obj: dict[str, Any] = {"backends": rows}
        for name, (adapters, why) in listings.items():
            obj[f"{name}_adapters"], obj[f"{name}_adapters_reason"] = adapters, why
        report.print_json(obj)
        return 0
    t = Table(title="backends", title_justify="left")
    for col in ("backend", "status", "devices / reason"):
        t.add_column(col, overflow="fold")
    for r in rows:
        status = ("[yellow]software[/yellow]" if r["software"] else "[green]available[/green]") if r["available"] \
            else "[red]unavailable[/red]"
        shown = ", ".join(r["devices"]) + (f" ({r['not_auto']})" if r["not_auto"] else "") if r["available"] \
            else r["reason"]
        t.add_row(r["name"], status, shown)
    ctx.out.print(t)
    for name, (adapters, why) in listings.items():
        if not adapters:
            ctx.out.print(f"{name} adapters: none ({why})" if why else f"{name} adapters: none", highlight=False,
                          soft_wrap=True)
            continue
        ctx.out.print(adapter_table(name, adapters))
        if any(a["software"] for a in adapters):
            ctx.note(f"software adapters run only with --device {name} --allow-software-adapter (or "
                     "UAII_ALLOW_SOFTWARE_GPU=1); --device auto never picks one")
    return 0


def adapter_table(backend: str, adapters: list[dict[str, Any]]) -> Table:
    """One row per adapter of ``backend``: index; name, vendor and driver; backend and type; software; memory; key
    limits; features."""
    t = Table(title=f"{backend} adapters", title_justify="left")
    for col in ("#", "adapter / vendor / driver", "backend", "software", "memory", "limits", "features"):
        fixed = col in ("limits", "features", "memory", "software")
        t.add_column(col, overflow="fold", no_wrap=fixed)
    for a in adapters:
        lim = a["limits"]
        limits = "\n".join(f"{label} {fmt(lim[key])}" for key, label, fmt in (
            ("max-buffer-size", "buffer", report.size), ("max-storage-buffer-binding-size", "binding", report.size),
            ("max-storage-buffers-per-shader-stage", "storage buffers", str),
            ("max-compute-workgroup-storage-size", "workgroup", report.size)) if key in lim)
        name = "\n".join(x for x in (a["name"], a["vendor"] and f"vendor {a['vendor']}", a["driver"]) if x)
        backend = f"{a['backend']}\n{a['type'] or 'unknown type'}" + ("" if a["usable"] else "\n(not used)")
        memory = report.size(a["memory_bytes"]) if a["memory_bytes"] else "not reported"
        t.add_row(str(a["index"]), name, backend, "yes" if a["software"] else "no", memory, limits,
                  "\n".join(a["features"]) or "-")
    return t


# ----------------------------------------------------------------------------------------------------- cache
def cmd_cache(args: argparse.Namespace, ctx: Context) -> int:
    from uaii import planner

    if args.action == "clear":
        before = planner.status()
        removed = planner.clear()
        obj = {"path": before.path, "removed": removed, "freed_bytes": before.total_bytes}
        if args.json:
            report.print_json(obj)
        else:
            ctx.out.print(f"removed {removed} plan cache entr{'y' if removed == 1 else 'ies'} "
                          f"({report.size(before.total_bytes) if removed else '0 B'}) from {before.path}",
                          highlight=False, soft_wrap=True)
        return 0
    st = planner.status()
    if args.json:
        report.print_json({"path": st.path, "entries": st.entries, "total_bytes": st.total_bytes})
    else:
        ctx.out.print(f"plan cache {st.path}: {st.entries} entr{'y' if st.entries == 1 else 'ies'}, "
                      f"{report.size(st.total_bytes) if st.entries else '0 B'}", highlight=False, soft_wrap=True)
    return 0


# ------------------------------------------------------------------------------------------------------ plan
def cmd_plan(args: argparse.Namespace, ctx: Context) -> int:
    try:
        from uaii.planner import summarize
    except ImportError:
        raise CliError("uaii plan needs uaii-planner, which is not installed: pip install uaii-planner") from None

    path = model_path(args.model)
    if args.pipeline is not None:
        return plan_pipeline(args, ctx, path)
    if args.budget_per_node is not None or args.pipeline_starts is not None:
        raise CliError("--budget-per-node and --pipeline-starts apply only with --pipeline K")
    preset = presets.resolve(args.preset, args.budget)
    session = ctx.open_session(path, **preset.session_options())  # the plan the runtime would run with
    try:
        execution_plan, hit = session.plan, bool(getattr(session, "plan_cache_hit", False))
    finally:
        session.close()
    if execution_plan is None:  # the Session logged why (a warning above this line)
        raise CliError(f"{path}: no storage plan could be made for this model (the warning above says why); a "
                       "session runs its graph in its own order, without a plan")
    summary = summarize(execution_plan)
    if args.json:
        report.print_json({"model": str(path), "preset": preset.name, "cache_hit": hit, **summary})
        return 0
    ctx.out.print(f"storage plan of {path.name} · preset {preset.describe()} · "
                  f"{'from the plan cache' if hit else 'planned now'} · {summary['steps']} steps", highlight=False,
                  soft_wrap=True)
    groups = Table(title="weights", title_justify="left")
    for col in ("group", "mode", "bytes"):
        groups.add_column(col, justify="right" if col == "bytes" else "left")
    for name, mode, total in fold_groups(summary["groups"]):
        groups.add_row(name, mode, report.size(total))
    ctx.out.print(groups)
    totals = Table(title="memory", title_justify="left", show_header=False)
    totals.add_column("part")
    totals.add_column("bytes", justify="right")
    for key in ("budget_bytes", "pinned_bytes", "mapped_bytes", "staging_bytes", "arena_bytes", "kv_cache_bytes",
                "expert_cache_bytes", "total_bytes", "streamed_bytes_per_token"):
        value = summary.get(key)
        if key == "budget_bytes" and not value:
            totals.add_row("budget", "unlimited")
            continue
        totals.add_row(key.removesuffix("_bytes").replace("_", " "), report.size(value) if value else "0")
    ctx.out.print(totals)
    return 0


def plan_pipeline(args: argparse.Namespace, ctx: Context, path: Any) -> int:
    """``uaii plan --pipeline K``: the split for K nodes of --budget-per-node each and every stage's plan, made
    here without compiling or reading a weight (uaii.runtime.pipeline.plan_stages)."""
    from uaii.runtime.pipeline import plan_stages

    if args.pipeline < 2:
        raise CliError(f"--pipeline must be >= 2 (stages), found {args.pipeline}")
    if args.budget is not None:
        raise CliError("--budget is one process's budget; with --pipeline give each stage's: --budget-per-node")
    preset = presets.resolve(args.preset, args.budget_per_node)
    options = {k: v for k, v in preset.session_options().items() if k not in ("preset", "budget_bytes")}
    if args.max_context is not None:
        options["max_context"] = args.max_context
    starts = pipeline_starts(args.pipeline_starts) if args.pipeline_starts else ()
    stages = plan_stages(path, args.pipeline, preset.budget_bytes, starts, **options)
    if args.json:
        report.print_json({"model": str(path), "preset": preset.name, "budget_per_node": preset.budget_bytes,
                           "stages": [asdict(s) for s in stages]})
        return 0
    ctx.out.print(f"pipeline plan of {path.name} · {args.pipeline} stages · budget per node "
                  f"{report.size(preset.budget_bytes) if preset.budget_bytes else 'unlimited'}", highlight=False,
                  soft_wrap=True)
    t = Table(title="stages", title_justify="left")
    for col in ("stage", "layers", "weights", "pinned", "streamed / token", "KV cache", "memory", "sends / token"):
        t.add_column(col, justify="left" if col in ("stage", "layers") else "right")
    for s in stages:
        t.add_row(str(s.index), f"{s.first}-{s.last - 1}", report.size(s.weight_bytes), report.size(s.pinned_bytes),
                  report.size(s.streamed_bytes_per_token) if s.streamed_bytes_per_token else "0",
                  report.size(s.kv_cache_bytes), report.size(s.total_bytes),
                  report.size(s.sends_bytes_per_token) if s.sends_bytes_per_token else "-")
    ctx.out.print(t)
    streamed = sum(s.streamed_bytes_per_token for s in stages)
    ctx.out.print(f"per token: {report.size(streamed) if streamed else 'nothing'} read from disk over all stages, "
                  f"{report.size(sum(s.sends_bytes_per_token for s in stages))} sent between them", highlight=False)
    return 0


def fold_groups(groups: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    """Runs of layer groups with the same mode and size as one row: ``blk.2-29 (28 layers)``."""
    rows: list[tuple[str, str, int]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if len(run) == 1:
            rows.append((str(run[0]["group"]), str(run[0]["mode"]), int(run[0]["bytes"])))
        elif run:
            first, last = run[0]["group"], run[-1]["group"].rsplit(".", 1)[1]
            rows.append((f"{first}-{last} ({len(run)} layers)", str(run[0]["mode"]), sum(g["bytes"] for g in run)))
        run.clear()

    for g in groups:
        prefix, _, index = str(g["group"]).rpartition(".")
        prev = run[-1] if run else None
        follows = (prev is not None and index.isdigit() and str(prev["group"]).rpartition(".")[0] == prefix
                   and prev["mode"] == g["mode"] and prev["bytes"] == g["bytes"])
        if not follows:
            flush()
        if index.isdigit():
            run.append(g)
        else:
            rows.append((str(g["group"]), str(g["mode"]), int(g["bytes"])))
    flush()
    return rows


# --------------------------------------------------------------------------------------------------- presets
def cmd_presets(args: argparse.Namespace, ctx: Context) -> int:
    all_presets = presets.presets()
    if args.json:
        report.print_json({"default": presets.DEFAULT_PRESET, "presets": [asdict(p) for p in all_presets]})
        return 0
    t = Table(title=f"memory presets (the CLI's default: {presets.DEFAULT_PRESET})", title_justify="left")
    for col in ("preset", "budget", "kv window", "kv sinks", "kv cache", "what for"):
        t.add_column(col)
    for p in all_presets:
        t.add_row(p.name, report.size(p.budget_bytes) if p.budget_bytes else "unlimited",
                  str(p.kv_window or "unbounded"), str(p.kv_sinks), p.kv_dtype, p.description)
    ctx.out.print(t)
    return 0


__all__ = ["adapter_rows", "adapter_table", "add_parsers", "cmd_cache", "cmd_devices", "cmd_plan", "cmd_presets",
           "device_rows", "fold_groups"]
