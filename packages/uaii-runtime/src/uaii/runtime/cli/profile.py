"""``uaii bench --profile``: where a decode step's time goes — kernel time per op family, the executor's time
between kernels, the session's time outside the forward pass — and the GB/s each family of weight products
reads, next to the copy bandwidth measured in the same run.

The profile is taken on its own generation after the benchmark's (same prompt, which the session's prompt cache
keeps, so the decode starts at the same context): timing every step costs a little, and the tok/s the
benchmark prints are measured without it.
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from uaii.runtime.sampling import SamplingParams

COPY_BYTES = 256 << 20
"""The copy the bandwidth is measured with: far larger than any cache (read + written bytes are counted)."""


def profile_decode(session: Any, ids: list[int], gen_tokens: int) -> dict[str, Any]:
    """A greedy generation of ``gen_tokens`` after ``ids`` with every step timed; returns the decode profile as a
    JSON-ready dict (per token figures in ms, weights in bytes, GB/s; :func:`render` prints it)."""
    from .bench import generate_ignoring_eos  # bench imports this module

    session.set_profiling(True)
    try:
        result = generate_ignoring_eos(session, ids, gen_tokens, SamplingParams())
        profiles = session.take_profile()
    finally:
        session.set_profiling(False)
    steps = max(len(result.tokens) - 1, 0)
    return _summary(session, profiles, 1, steps, result.stats.decode_s, [len(ids), len(ids) + steps])


def profile_batch(session: Any, prompts: list[list[int]], gen_tokens: int) -> dict[str, Any]:
    """The decode steps of ``len(prompts)`` sequences together (cli.batch.run_batch) with every step timed: the
    profile of one batched pass (ms per pass; a pass makes one token per sequence)."""
    from .batch import run_batch

    session.set_profiling(True)
    try:
        got = run_batch(session, prompts, gen_tokens)
        profiles = session.take_profile()
    finally:
        session.set_profiling(False)
    n, steps = len(prompts), got["batch_decode_steps"]
    length = len(prompts[0]) if prompts else 0
    return _summary(session, profiles, n, steps, got["batch_decode_s"], [length, length + steps])


def _summary(session: Any, profiles: list[Any], rows: int, steps: int, seconds: float,
             context: list[int]) -> dict[str, Any]:
    from uaii.kernels import copy_bandwidth, get_isa, get_num_threads

    decode = next((p for p in profiles if p.rows == rows), None)
    if decode is None or not decode.runs or not steps:
        return {"available": False, "reason": "no decode step ran"}
    per = 1e3 / decode.runs
    wall_ms = seconds * 1e3 / steps
    run_ms = decode.run_seconds * per
    t0 = time.perf_counter()
    copy_gbs = copy_bandwidth(COPY_BYTES, 0.3)
    families = []
    for f in decode.families():
        ms = f.seconds * per
        gbs = f.weight_bytes / (ms / 1e3) / 1e9 if f.weight_bytes and ms > 0 else None
        families.append({"family": f.family, "nodes": f.nodes, "ms": ms, "weight_bytes": f.weight_bytes,
                         "gb_s": gbs, "x_copy": gbs / copy_gbs if gbs else None})
    return {
        "available": True,
        "rows": rows,
        "tokens": steps,
        "context": context,
        "kv_dtype": session.options.kv_dtype,
        "threads": get_num_threads(),
        "isa": get_isa(),
        "steps_per_token": decode.steps_per_run,
        "ms_per_token": wall_ms,
        "run_ms": run_ms,
        "kernels_ms": decode.step_seconds * per,
        "executor_ms": decode.executor_seconds * per,
        "session_ms": max(wall_ms - run_ms, 0.0),
        "families": families,
        "copy_gb_s": copy_gbs,
        "copy_seconds": time.perf_counter() - t0,
    }


def render(prof: dict[str, Any]) -> Table:
    """The decode profile as a table: one row per op family, then the executor and the session."""
    rows = prof.get("rows", 1)
    what = f"{prof['tokens']} tokens" if rows == 1 else f"{prof['tokens']} passes of {rows} sequences"
    unit = "token" if rows == 1 else f"pass ({rows} tokens)"
    title = (f"decode profile: {what} at context {prof['context'][0]}-{prof['context'][1]}, "
             f"KV {prof['kv_dtype']}, {prof['threads']} threads ({prof['isa']}): "
             f"{prof['ms_per_token']:.3f} ms per {unit}, {prof['steps_per_token']} steps")
    table = Table(title=title, title_justify="left")
    per = "token" if rows == 1 else "pass"
    for col, justify in (("where", "left"), (f"ms/{per}", "right"), ("share", "right"), ("nodes", "right"),
                         (f"weights/{per}", "right"), ("GB/s", "right"), ("x copy", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    total = prof["ms_per_token"] or 1.0

    def row(name: str, ms: float, nodes: str = "", wbytes: int = 0, gbs: float | None = None,
            x: float | None = None) -> None:
        table.add_row(name, f"{ms:.3f}", f"{100 * ms / total:.1f}%", nodes,
                      f"{wbytes / 2**20:.1f} MiB" if wbytes else "", f"{gbs:.1f}" if gbs else "",
                      f"{x:.2f}" if x else "")

    for f in prof["families"]:
        row(f["family"], f["ms"], str(f["nodes"]), f["weight_bytes"], f["gb_s"], f["x_copy"])
    row("executor (feeds, state, step loop)", prof["executor_ms"])
    row("session (sampling, detokenize, Python)" if rows == 1 else "session and caller (argmax, Python)",
        prof["session_ms"])
    table.caption = (f"copy bandwidth, same run and threads: {prof['copy_gb_s']:.1f} GB/s (read + written); "
                     f"'x copy' divides a product's weight read rate by it")
    return table


__all__ = ["profile_batch", "profile_decode", "render"]
