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
    from uaii.kernels import copy_bandwidth, get_isa, get_num_threads

    session.set_profiling(True)
    try:
        kwargs: dict[str, Any] = {"max_new_tokens": gen_tokens, "sampling": SamplingParams(), "add_special": False,
                                  "ignore_eos": True}
        result = session.generate(ids, **kwargs)
        profiles = session.take_profile()
    finally:
        session.set_profiling(False)
    decode = next((p for p in profiles if p.rows == 1), None)
    stats = result.stats
    steps = max(len(result.tokens) - 1, 0)
    if decode is None or not decode.runs or not steps:
        return {"available": False, "reason": "no decode step ran"}
    per = 1e3 / decode.runs
    wall_ms = stats.decode_s * 1e3 / steps
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
        "tokens": steps,
        "context": [len(ids), len(ids) + steps],
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
    title = (f"decode profile: {prof['tokens']} tokens at context {prof['context'][0]}-{prof['context'][1]}, "
             f"KV {prof['kv_dtype']}, {prof['threads']} threads ({prof['isa']}): "
             f"{prof['ms_per_token']:.3f} ms per token, {prof['steps_per_token']} steps")
    table = Table(title=title, title_justify="left")
    for col, justify in (("where", "left"), ("ms/token", "right"), ("share", "right"), ("nodes", "right"),
                         ("weights/token", "right"), ("GB/s", "right"), ("x copy", "right")):
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
    row("session (sampling, detokenize, Python)", prof["session_ms"])
    table.caption = (f"copy bandwidth, same run and threads: {prof['copy_gb_s']:.1f} GB/s (read + written); "
                     f"'x copy' divides a product's weight read rate by it")
    return table


__all__ = ["profile_decode", "render"]
