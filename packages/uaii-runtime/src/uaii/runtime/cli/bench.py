"""``uaii bench``: load time, prefill tok/s of a ~512-token prompt, greedy decode tok/s of 128 tokens, peak RSS.

The prompt is built from a fixed English text (:data:`BENCH_TEXT`), tokenized and cut to exactly
``--prompt-tokens`` ids, so every engine that tokenizes it the same way sees the same ids
(:func:`bench_prompt_ids`; ``bench/bench_generate.py`` reuses it for its reference runs).
"""

from __future__ import annotations

import argparse
import inspect
import resource
import sys
import time
from typing import Any

from rich.table import Table

from uaii.runtime.sampling import SamplingParams

from . import report
from .batch import run_batch
from .context import CliError, Context, add_model_argument, add_runtime_options, model_path, runtime_options
from .profile import profile_batch, profile_decode, render

BENCH_TEXT = (
    "The history of computing is a history of memory. Early machines stored a few thousand words in mercury "
    "delay lines and magnetic drums, and programmers arranged their instructions around the rotation of the "
    "drum so that the next word arrived under the read head just as it was needed. Core memory made every word "
    "equally close, and for a while the question of where data lived seemed settled. Then processors grew "
    "faster than memory could follow, caches appeared, and the distance between a value and the arithmetic "
    "unit that consumes it became once again the thing that decides how fast a program runs. Language models "
    "are the latest chapter of this story. Their weights are read once for every token they produce, so the "
    "speed of generation is bounded by how many bytes per second reach the processor, not by how many "
    "multiplications it can perform. A runtime that treats storage as the first concern plans which tensors "
    "stay resident, which stream from disk, and in what order they are read, so that the next weights are "
    "already arriving while the current ones are used. "
)


def add_parsers(sub: Any) -> None:
    ap = sub.add_parser("bench", help="prefill and decode tok/s, peak RSS and load time of a model")
    add_model_argument(ap)
    ap.add_argument("--prompt-tokens", type=int, default=512, metavar="N", help="prompt length in tokens (512)")
    ap.add_argument("--gen-tokens", type=int, default=128, metavar="N", help="tokens to decode, greedy (128)")
    ap.add_argument("--warmup", type=int, default=1, metavar="N",
                    help="short warm-up generations before measuring (1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--batch", type=int, default=1, metavar="N",
                    help="then decode N sequences together (one forward pass per step): aggregate and per-sequence "
                         "tok/s, the ratio to one sequence, bytes read per generated token (1: skip)")
    ap.add_argument("--profile", action="store_true",
                    help="then profile the decode: ms per token by op family, executor and session time, the GB/s "
                         "of the weight products against the copy bandwidth (one more generation, timed per step)")
    add_runtime_options(ap)
    ap.set_defaults(func=cmd_bench)


def bench_prompt_ids(tokenize: Any, n_tokens: int, bos: int | None = None) -> list[int]:
    """Exactly ``n_tokens`` ids of :data:`BENCH_TEXT` repeated (after ``bos`` when the model starts with one)."""
    body = list(tokenize(BENCH_TEXT))
    if not body:
        raise CliError("the benchmark text tokenizes to nothing")
    ids = [] if bos is None else [bos]
    while len(ids) < n_tokens:
        ids.extend(body)
    return ids[:n_tokens]


def _bos_of(session: Any) -> int | None:
    """The BOS id the model's tokenizer adds, if any (compared: tokenize with and without special tokens)."""
    with_special = session.tokenize("a", add_special=True)
    plain = session.tokenize("a", add_special=False)
    if len(with_special) > len(plain) and with_special[-len(plain):] == plain:
        return int(with_special[0])
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports KiB)."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(usage) * (1 if sys.platform == "darwin" else 1024)


def session_prompt_ids(session: Any, prompt_tokens: int) -> list[int]:
    """The benchmark prompt in ``session``'s tokenizer (after its BOS, where it adds one)."""
    return bench_prompt_ids(lambda t: session.tokenize(t, add_special=False), prompt_tokens, _bos_of(session))


def batch_prompt_ids(session: Any, prompt_tokens: int, n: int) -> list[list[int]]:
    """``n`` prompts of ``prompt_tokens`` ids each: the benchmark text from 7 tokens further on per sequence (after
    the BOS, where the model adds one), so that the rows of a batch differ."""
    bos = _bos_of(session)
    body_len = prompt_tokens - (bos is not None)
    body = bench_prompt_ids(lambda t: session.tokenize(t, add_special=False), body_len + 7 * n)
    head = [bos] if bos is not None else []
    return [head + body[7 * i: 7 * i + body_len] for i in range(n)]


def run_bench(session: Any, *, prompt_tokens: int, gen_tokens: int, warmup: int = 1) -> dict[str, Any]:
    """Measure one session: prefill of ``prompt_tokens`` ids, then ``gen_tokens`` greedy tokens."""
    ids = session_prompt_ids(session, prompt_tokens)
    greedy = SamplingParams()
    for _ in range(warmup):
        session.generate(ids[:16], max_new_tokens=4, sampling=greedy, add_special=False)
    # The warm-up's tokens are the prompt's first 16: generate would reuse them from the KV cache, and the prefill
    # figure would time only the rest (none at all for a prompt of 16 tokens or fewer: 0 tok/s)
    session.reset()
    t0 = time.perf_counter()
    result = generate_ignoring_eos(session, ids, gen_tokens, greedy)
    wall = time.perf_counter() - t0
    stats = report.stats_dict(result.stats)
    new = len(result.tokens)
    return {
        "prompt_tokens": len(ids),
        "gen_tokens": gen_tokens,
        "new_tokens": new,
        "finish_reason": result.finish_reason,
        "stopped_early": new < gen_tokens,
        "prefill_tok_s": stats.get("prefill_tok_s"),
        "decode_tok_s": stats.get("decode_tok_s"),
        "ttft_s": stats.get("ttft_s"),
        "prefill_s": stats.get("prefill_s"),
        "decode_s": stats.get("decode_s"),
        "wall_s": wall,
        "peak_rss_bytes": max(int(stats.get("peak_rss_bytes") or 0), peak_rss_bytes()),
        "bytes_read_per_token": stats.get("bytes_read_per_token"),
        "plan_cache_hit": stats.get("plan_cache_hit"),
    }


def kv_for_bench(options: dict[str, Any], tokens: int) -> dict[str, Any]:
    """KV options for a run that never holds more than ``tokens`` tokens: a cache of exactly that many (no window),
    unless the preset's window is smaller. A preset's 2048-token window would reserve (and, under a budget, plan)
    a KV cache the benchmark never fills: SmolLM2's is 90 MiB, more than a 50 % budget of its weights."""
    window = int(options.get("kv_window") or 0)
    if window and window + int(options.get("kv_sinks") or 0) <= tokens:
        return {}
    return {"kv_window": 0, "max_context": tokens}


def generate_ignoring_eos(session: Any, ids: list[int], n: int, greedy: SamplingParams) -> Any:
    """Generate ``n`` tokens: EOS must not end a benchmark early, where the Session lets us say so."""
    kwargs: dict[str, Any] = {"max_new_tokens": n, "sampling": greedy, "add_special": False}
    if "ignore_eos" in inspect.signature(session.generate).parameters:
        kwargs["ignore_eos"] = True  # otherwise it stops at EOS; the result says so (stopped_early)
    return session.generate(ids, **kwargs)


def cmd_bench(args: argparse.Namespace, ctx: Context) -> int:
    path = model_path(args.model)
    if args.prompt_tokens < 1 or args.gen_tokens < 1:
        raise CliError("--prompt-tokens and --gen-tokens must be >= 1")
    preset, options = runtime_options(args)
    if args.batch < 1:
        raise CliError("--batch must be >= 1")
    options.update(kv_for_bench(options, args.prompt_tokens + args.gen_tokens))
    if args.batch > 1:
        options["sequences"] = args.batch  # a budget keeps room for their KV states
    t0 = time.perf_counter()
    session = ctx.open_session(path, **options)
    load_s = time.perf_counter() - t0
    try:
        with ctx.status(f"benchmarking {path.name} ..."):
            res = run_bench(session, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                            warmup=args.warmup)
        if args.batch > 1:
            with ctx.status(f"decoding {args.batch} sequences together ..."):
                prompts = batch_prompt_ids(session, args.prompt_tokens, args.batch)
                batch = run_batch(session, prompts, args.gen_tokens)
                single = res.get("decode_tok_s") or 0.0
                batch["batch_ratio"] = batch["batch_decode_tok_s"] / single if single else None
        if args.profile:
            with ctx.status("profiling the decode ..."):
                prof = profile_decode(session, session_prompt_ids(session, args.prompt_tokens), args.gen_tokens)
                if args.batch > 1:
                    prof_batch = profile_batch(session, prompts, min(args.gen_tokens, 32))
        info = getattr(session, "model_info", None)
        device = getattr(getattr(session, "backend", None), "name", None)  # the backend --device auto chose
    finally:
        session.close()
    res = {"model": str(path), "architecture": report.stat(info, "arch") or report.stat(info, "architecture"),
           "n_params": report.stat(info, "n_params"), "load_s": load_s, "n_threads": args.threads,
           "device": device, "preset": preset.name, "budget_bytes": preset.budget_bytes, **res}
    if args.batch > 1:
        res.update(batch)
    if args.profile:
        res["profile"] = prof
        if args.batch > 1:
            res["profile_batch"] = prof_batch
    if args.json:
        report.print_json(res)
        return 0
    table = Table(title=f"uaii bench {path.name}", title_justify="left", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("architecture", str(res["architecture"] or "-"))
    table.add_row("device", str(device or "-"))
    table.add_row("load", report.seconds(load_s))
    table.add_row(f"prefill ({res['prompt_tokens']} tokens)", report.rate(res["prefill_tok_s"]))
    table.add_row(f"decode ({res['new_tokens']} tokens, greedy)", report.rate(res["decode_tok_s"]))
    table.add_row("time to first token", report.seconds(res["ttft_s"]))
    if args.batch > 1:
        table.add_row(f"decode, {args.batch} sequences together", f"{report.rate(res['batch_decode_tok_s'])} "
                      f"({report.rate(res['batch_per_sequence_tok_s'])} each)")
        ratio = res.get("batch_ratio")
        table.add_row(f"{args.batch} sequences vs 1", f"{ratio:.2f}x" if ratio else "-")
        if not res["batched_pass"]:
            table.add_row("batched pass", "no: one pass per sequence (backend or budget)")
        if res["batch_bytes_read_per_token"] is not None:
            table.add_row("bytes read per generated token", report.size(res["batch_bytes_read_per_token"]))
    table.add_row("peak RSS", report.size(res["peak_rss_bytes"]))
    table.add_row("preset", preset.describe())
    ctx.out.print(table)
    if args.profile:
        if prof.get("available"):
            ctx.out.print(render(prof))
        else:
            ctx.note(f"note: no decode profile: {prof.get('reason')}")
        if args.batch > 1 and prof_batch.get("available"):
            ctx.out.print(render(prof_batch))
    if res["stopped_early"]:
        ctx.note(f"note: generation stopped after {res['new_tokens']} of {args.gen_tokens} tokens "
                 f"({res['finish_reason']}); decode tok/s covers those")
    return 0


__all__ = ["BENCH_TEXT", "add_parsers", "batch_prompt_ids", "bench_prompt_ids", "cmd_bench", "generate_ignoring_eos",
           "kv_for_bench", "peak_rss_bytes", "run_bench", "session_prompt_ids"]
