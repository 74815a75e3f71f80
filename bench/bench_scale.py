"""Scale benchmark (`make bench-scale`): the storage-first headline on real shapes, in a box smaller than the model.

The dense model: Qwen2.5-32B shapes (d_model 5120, 64 layers, 40 query / 8 KV heads, head_dim 128, d_ff 27648,
vocab 152064, a separate lm_head), Q4_0, random weights with sane scales (bench/synth_gguf.py: ~18.4 GB, written
once into the model cache). Every engine runs in a fresh 8 GiB memory cgroup (bench/memory_box.py: the page cache
counts against it) after the page cache is dropped, and the box's peak is read back:

1. the disk's raw rate: O_DIRECT reads of 4 and 16 MiB with 1-32 in flight (threads) over the model file; the best
   is the reference of every read rate below, with its queue depth;
2. UAII (``preset auto``: the budget comes from the box, not the host), one process: a prompt's prefill (bytes read
   per prompt token against the plan's streamed bytes: a chunk reads each streamed weight once), then greedy decode
   (tok/s, bytes per token against the plan, effective read GB/s against the raw best), then 4 sequences decoding
   together (``uaii bench --batch``'s measure: each streamed byte read once per step for all 4);
3. llama.cpp (llama-cpp-python built from the sdist into .venv-llama-cpp, mmap on, default settings), the same
   prompt ids and token count: tok/s, bytes the process read from storage (/proc/self/io) and whether it finished.
   Its default repacks the weights into anonymous memory, which in a box smaller than the model thrashes (an 8 GiB
   box: 150 GB read in 5 minutes without a token); a default run that has not finished after max(240 s, 3 x UAII's
   run) is stopped, reported, and followed by a run with --no-repack (the weights stay in the mapped file).

The bound it prints: decode tok/s <= raw GB/s / streamed GB per token (the disk cannot be read faster; only fewer
bytes per token beat it).

The MoE: a 3-layer slice of Qwen3-Coder-480B-A35B shapes (d_model 6144, 96 query / 8 KV heads of 128, 160 experts
of d_ff 2560, top-8, vocab 151936, Q4_0: ~14 GB; the full 62 layers would be ~265 GB, more than the disk), written
twice: routers without locality (every expert alike) and with a Zipf-like popularity per layer (``--moe-zipf``,
synth_gguf.router_gains). In the same box, UAII with the expert cache the budget leaves (the runtime's default)
and, as the reference without reuse, the smallest cache: bytes read per decode token against the plan's streamed
bytes (attention + the top-k experts, nothing cached), the expert cache's hit rate per layer and the bytes it
saved; then the 62-layer extrapolation of the per-layer figures (labelled so), and llama.cpp on the
locality slice (mmap: the box's page cache is its only expert cache).

    make bench-scale                                          # ~15 minutes once the models are written
    uv run --no-sync python bench/bench_scale.py --gen-tokens 2 --json out.json
    uv run --no-sync python bench/bench_scale.py --models moe --no-llama-cpp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))  # sibling modules

import memory_box  # noqa: E402
from bench_storage_io import raw_read  # noqa: E402
from llama_cpp_worker import read_bytes  # noqa: E402  (stdlib only: it runs in llama.cpp's environment too)

GiB, MiB, GB = 1 << 30, 1 << 20, 1e9
BOX_BYTES = 8 * GiB
DENSE_GB = 18.4  # the name of its cache file (synth_gguf.default_path); the size comes from the shape
DENSE = {"n_layers": 64, "d_model": 5120, "n_heads": 40, "n_kv_heads": 8, "d_ff": 27648, "vocab": 152064}
RAW_DEPTHS = (1, 2, 4, 8, 16, 32)
RAW_BLOCKS = (4 * MiB, 16 * MiB)
MOE_GB = 14.0  # the name of its cache files
MOE = {"n_layers": 3, "d_model": 6144, "n_heads": 96, "n_kv_heads": 8, "head_dim": 128, "d_ff_expert": 2560,
       "n_experts": 160, "top_k": 8, "vocab": 151936}
MOE_FULL_LAYERS = 62  # Qwen3-Coder-480B-A35B
MOE_ZIPF = 1.0  # the locality slice's router popularity exponent (synth_gguf.router_gains)
READ_TARGET, BYTES_TARGET, PREFILL_TARGET, BATCH_TARGET = 0.85, 1.05, 1.1, 3.5
STALL_MIN_S, STALL_FACTOR = 240.0, 3.0  # llama.cpp's default run is given max(this, factor x uaii's run)


# ============================================================================ the worker (inside the box)
def uaii_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Prefill, decode and 4-sequence decode of one session under the auto preset (the box's limit)."""
    from uaii.planner import summarize
    from uaii.runtime import Session
    from uaii.runtime.cli.batch import run_batch
    from uaii.runtime.cli.bench import batch_prompt_ids, session_prompt_ids

    P, G, N = spec["prompt_tokens"], spec["gen_tokens"], spec["batch"]
    t0 = time.perf_counter()
    s = Session(spec["path"], preset="auto", n_threads=spec["threads"], kv_dtype="f16", kv_window=0,
                max_context=P + G + 8, sequences=N, **spec.get("options", {}))
    out: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    with s:
        plan = summarize(s.plan)
        out["plan"] = {k: plan[k] for k in ("budget_bytes", "pinned_bytes", "staging_bytes", "streamed_bytes_per_token",
                                            "streamed_bytes", "kv_cache_bytes", "expert_cache_bytes", "arena_bytes",
                                            "total_bytes")}

        def read() -> int:
            return int(s.storage_stats().get("bytes_read", 0) or 0)

        ids = session_prompt_ids(s, P)
        out["prompt_ids"] = ids
        b0, t0 = read(), time.perf_counter()
        first = s.generate(ids, max_new_tokens=1, ignore_eos=True)  # the prompt's passes only
        out["prefill"] = {"tokens": P, "s": time.perf_counter() - t0, "bytes": read() - b0,
                          "stats_tok_s": first.stats.prefill_tok_s}
        # decode: the prompt and its token again; the cache holds the prompt, so each of the G passes is one token
        b0, t0, e0 = read(), time.perf_counter(), s.storage_stats().get("expert_cache")
        res = s.generate([*ids, *first.tokens], max_new_tokens=G, ignore_eos=True)
        out["decode"] = {"passes": G, "s": time.perf_counter() - t0, "bytes": read() - b0,
                         "tokens": list(res.tokens)}
        e1 = s.storage_stats().get("expert_cache")
        if e0 is not None and e1 is not None:  # the decode passes' share of the expert cache's counters
            out["experts"] = expert_delta(e0, e1)
        s.reset()
        if N > 1:
            prompts = batch_prompt_ids(s, spec["batch_prompt_tokens"], N)
            out["batch"] = run_batch(s, prompts, G + 1)  # G passes of N tokens (the first comes from prefill)
        out["io_read_bytes"] = read_bytes()
    return out


def expert_delta(e0: dict[str, Any], e1: dict[str, Any]) -> dict[str, Any]:
    """Hits, misses and bytes read of the expert cache between two of its stats snapshots, in all and per layer."""
    def part(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        hits, misses = b["hits"] - a.get("hits", 0), b["misses"] - a.get("misses", 0)
        return {"hits": hits, "misses": misses, "bytes_read": b["bytes_read"] - a.get("bytes_read", 0),
                "hit_rate": hits / (hits + misses) if hits + misses else None}

    layers = {k: part((e0.get("per_layer") or {}).get(k, {}), v) for k, v in (e1.get("per_layer") or {}).items()}
    return {**part(e0, e1), "budget_bytes": e1.get("budget_bytes"), "per_layer": layers}


# ============================================================================ the parent
def in_box(box_bytes: int, cmd: list[str], timeout: float) -> dict[str, Any]:
    """Runs a worker command in a fresh box after dropping the page cache; its JSON, the peak and the outcome."""
    dropped = memory_box.drop_caches()
    with memory_box.MemoryBox("uaii-scale", box_bytes) as box:
        t0 = time.perf_counter()
        proc = box.run(cmd, timeout=timeout, cwd=REPO)
        wall = time.perf_counter() - t0
        res: dict[str, Any] = {"wall_s": wall, "peak_bytes": box.peak_bytes(), "oom_kills": box.oom_kills(),
                               "cache_dropped": dropped, "returncode": proc.returncode, "cgroup": box.version}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        res.update(json.loads(lines[-1]))
    else:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        res["error"] = " | ".join(tail) or f"exit status {proc.returncode}"
    return res


def dense_model(quiet: bool) -> Path:
    from synth_gguf import default_path, ensure_synth, model_params

    params = model_params("llama", DENSE["n_layers"], "q4_0", 0,
                          **{k: v for k, v in DENSE.items() if k != "n_layers"})
    path = default_path("llama", DENSE_GB, "q4_0", params)
    if not quiet:
        print(f"dense model: {path} (written once, ~{DENSE_GB} GB; reused while its parameters hold)", flush=True)
    ensure_synth(path, params, quiet=quiet)
    return path


def moe_model(zipf: float, quiet: bool) -> Path:
    from synth_gguf import default_path, ensure_synth, model_params

    shape = {k: v for k, v in MOE.items() if k != "n_layers"}
    params = model_params("moe", MOE["n_layers"], "q4_0", 0, **shape, router_zipf=zipf or None)
    path = default_path("moe", MOE_GB, "q4_0", params)
    if not quiet:
        print(f"MoE slice (router zipf {zipf:g}): {path} (written once, ~{MOE_GB:g} GB)", flush=True)
    ensure_synth(path, params, quiet=quiet)
    return path


def raw_rates(path: Path, nbytes: int) -> dict[str, Any]:
    """GB/s of O_DIRECT reads at each queue depth and block size, each setting over its own stretch of the file (a
    stretch read twice could come from a cache below the page cache: a VM's host); the best and where."""
    settings = [(qd, block) for block in RAW_BLOCKS for qd in RAW_DEPTHS]
    span = 16 * MiB
    size = min(nbytes, path.stat().st_size // len(settings)) // span * span
    table = {f"{qd}x{block // MiB}MiB": raw_read(path, size, qd, block, offset=i * size)
             for i, (qd, block) in enumerate(settings)}
    best = max(table, key=lambda k: table[k])
    return {"bytes": size, "gbps": table, "best": best, "best_gbps": table[best]}


def run_llama(box: int, python: Path, model: Path, ids: list[int], args: argparse.Namespace,
              stall_s: float) -> dict[str, Any]:
    """llama.cpp with its defaults; where those do not finish within ``stall_s`` (its default repacks the weights
    into anonymous memory: in a box smaller than the model that thrashes), again with --no-repack. Both kept."""
    ids_file = Path(tempfile.mkstemp(suffix=".json")[1])
    ids_file.write_text(json.dumps(ids))
    cmd = [str(python), str(BENCH / "llama_cpp_worker.py"), str(model), str(ids_file), "--gen-tokens",
           str(args.gen_tokens), "--threads", str(args.threads)]
    try:
        default = in_box(box, cmd, stall_s)
        if "error" not in default:
            return default
        print(f"llama.cpp (defaults) did not finish: {default['error']}; again with --no-repack", flush=True)
        plain = in_box(box, [*cmd, "--no-repack"], args.timeout)
        plain["default_run"] = default
        return plain
    finally:
        ids_file.unlink()


def llama_beside(box: int, model: Path, ours: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp on ``model`` in the box with UAII's prompt ids (:func:`run_llama`), given max(STALL_MIN_S,
    STALL_FACTOR x UAII's run) before its default run counts as stalled."""
    import llama_cpp_env
    from bench_models import model_path

    # the build's smoke test on a small model: the build does not depend on the model, and loading a model of
    # several GB outside the box with llama.cpp's default repack would hold as much anonymous memory on the host
    python, why_not = llama_cpp_env.ensure(model_path("smollm2"))
    if python is None:
        return {"error": f"no llama.cpp build: {why_not}"}
    return run_llama(box, python, model, ours["prompt_ids"], args,
                     stall_s=max(STALL_MIN_S, STALL_FACTOR * ours["wall_s"]))


def fmt_gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


def mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report(raw: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any] | None, box_bytes: int) -> None:
    best = raw["best_gbps"]
    print(f"\nraw disk (O_DIRECT, {fmt_gb(raw['bytes'])} per setting; in flight x block):")
    print("  " + ", ".join(f"{k} {v:.2f}" for k, v in raw["gbps"].items()) + f" GB/s; best {raw['best']} {best:.2f}")
    if "error" in ours:
        print(f"\nuaii: FAILED in the {box_bytes / GiB:.0f} GiB box: {ours['error']}")
        return
    plan = ours["plan"]
    per_tok = plan["streamed_bytes_per_token"]
    print(f"\nuaii (preset auto in the {box_bytes / GiB:.0f} GiB {ours['cgroup']} box: budget "
          f"{plan['budget_bytes'] / GiB:.2f} GiB, pinned {fmt_gb(plan['pinned_bytes'])}, streamed "
          f"{fmt_gb(per_tok)} per token; load {ours['load_s']:.1f} s)")
    pf = ours["prefill"]
    print(f"  prefill  {pf['tokens']} tokens: {pf['tokens'] / pf['s']:.3f} tok/s, {fmt_gb(pf['bytes'])} read = "
          f"{pf['bytes'] / max(per_tok, 1):.2f} x the streamed bytes ({fmt_gb(pf['bytes'] / pf['tokens'])} per prompt "
          f"token) [goal <= {PREFILL_TARGET} x once: {mark(pf['bytes'] <= PREFILL_TARGET * per_tok)}]")
    dc = ours["decode"]
    tok_s, bpt = dc["passes"] / dc["s"], dc["bytes"] / dc["passes"]
    rate = dc["bytes"] / dc["s"] / GB
    bound = best * GB / per_tok if per_tok else float("inf")
    print(f"  decode   {dc['passes']} tokens: {tok_s:.3f} tok/s; {fmt_gb(bpt)} read per token = "
          f"{bpt / max(per_tok, 1):.3f}"
          f" x plan [goal <= {BYTES_TARGET}: {mark(bpt <= BYTES_TARGET * per_tok)}]; read {rate:.2f} GB/s = "
          f"{rate / best:.2f} x raw best [goal >= {READ_TARGET}: {mark(rate >= READ_TARGET * best)}]")
    print(f"           bound: raw {best:.2f} GB/s / {fmt_gb(per_tok)} per token = {bound:.3f} tok/s; "
          f"decode = {tok_s / bound:.2f} x the bound")
    bt = ours.get("batch")
    if bt:
        ratio = bt["batch_decode_tok_s"] / tok_s if tok_s else 0.0
        bb = bt.get("batch_bytes_read_per_token")
        print(f"  batch {bt['batch']}  {bt['batch_decode_tok_s']:.3f} tok/s aggregate "
              f"({bt['batch_per_sequence_tok_s']:.3f} "
              f"each, batched pass: {bt['batched_pass']}) = {ratio:.2f} x one sequence [goal >= {BATCH_TARGET}: "
              f"{mark(ratio >= BATCH_TARGET)}]" + (f"; {fmt_gb(bb)} read per generated token" if bb else ""))
    print(f"  peak memory of the box {ours['peak_bytes'] / GiB:.2f} GiB = {ours['peak_bytes'] / box_bytes:.2f} x "
          "the box"
          f"{'' if ours['cache_dropped'] else ' (page cache NOT dropped: not root)'}")
    if theirs is None:
        return
    if "error" in theirs:
        print(f"\nllama.cpp: did not finish in the box: {theirs['error']} (oom kills {theirs.get('oom_kills')})")
        return
    default = theirs.get("default_run")
    if default is not None:
        print(f"\nllama.cpp with its defaults (repack on) did not finish in the box: {default['error']}; its peak "
              f"{(default.get('peak_bytes') or 0) / GiB:.2f} GiB, oom kills {default.get('oom_kills')}")
    how = "mmap, defaults" if theirs.get("repack", True) else "mmap, --no-repack"
    print(f"\nllama.cpp {theirs.get('version', '?')} ({how}) in the same box, same prompt and tokens:")
    lt = theirs["decode_tok_s"]
    dec_io = theirs.get("decode_io_read_bytes")
    per = f"{fmt_gb(dec_io / dc['passes'])} read per decode token, " if dec_io is not None else ""
    print(f"  prefill {theirs['prefill_tok_s']:.3f} tok/s, decode {lt:.3f} tok/s; {per}"
          f"{fmt_gb(theirs['io_read_bytes'] or 0)}"
          f" read in all (load, warm-up, prefill, decode); peak {theirs['peak_bytes'] / GiB:.2f} GiB; finished")
    prefill_ratio = (pf["tokens"] / pf["s"]) / theirs["prefill_tok_s"]
    print(f"  uaii / llama.cpp: decode {tok_s / lt:.2f}x, prefill {prefill_ratio:.2f}x")


def run_moe(box: int, args: argparse.Namespace) -> dict[str, Any]:
    """The MoE slice: per locality, UAII with the expert cache the budget leaves, and (no locality) with the
    smallest cache, the reference without reuse; then llama.cpp on the locality slice."""
    runs: dict[str, Any] = {}
    raw = None
    for zipf in (0.0, args.moe_zipf):
        path = moe_model(zipf, quiet=False)
        if raw is None:
            raw = raw_rates(path, int(args.raw_gb * GB))
            print(f"raw disk best (MoE file): {raw['best_gbps']:.2f} GB/s at {raw['best']}", flush=True)
        caches = [("auto", {})] + ([("smallest", {"expert_cache_bytes": 1})] if zipf == 0.0 else [])
        for label, options in caches:
            spec = {"path": str(path), "prompt_tokens": args.prompt_tokens, "gen_tokens": args.moe_gen_tokens,
                    "batch": args.batch if label == "auto" else 1, "batch_prompt_tokens": args.batch_prompt_tokens,
                    "threads": args.threads, "options": options}
            key = f"zipf {zipf:g}, cache {label}"
            runs[key] = res = in_box(box, [sys.executable, str(Path(__file__).resolve()), "--worker",
                                           json.dumps(spec)], args.timeout)
            res["zipf"], res["cache"], res["path"] = zipf, label, str(path)
            print(f"uaii MoE ({key}): {'FAILED: ' + res['error'] if 'error' in res else 'done'} in "
                  f"{res['wall_s']:.0f} s", flush=True)
    theirs = None
    local = runs.get(f"zipf {args.moe_zipf:g}, cache auto", {})
    if not args.no_llama_cpp and "error" not in local:
        largs = argparse.Namespace(**{**vars(args), "gen_tokens": args.moe_gen_tokens})
        theirs = llama_beside(box, Path(local["path"]), local, largs)
        print(f"llama.cpp MoE: {'did not finish' if 'error' in theirs else 'finished'}", flush=True)
    return {"raw": raw, "runs": runs, "llama_cpp": theirs}


def moe_token_bytes() -> tuple[float, float, float]:
    """Bytes a decode token reads with nothing cached, of the slice's shapes in Q4_0 (18 bytes per 32 weights):
    (attention of a layer, its top-k experts, the lm_head outside the layers)."""
    m, q = MOE, 18 / 32
    attn = (2 * m["n_heads"] * m["head_dim"] + 2 * m["n_kv_heads"] * m["head_dim"]) * m["d_model"] * q
    return attn, m["top_k"] * 3 * m["d_model"] * m["d_ff_expert"] * q, m["vocab"] * m["d_model"] * q


def report_moe(moe: dict[str, Any], box_bytes: int, zipf: float) -> None:
    raw, runs = moe["raw"], moe["runs"]
    best = raw["best_gbps"] if raw else 0.0
    m = MOE
    print(f"\nMoE: Qwen3-Coder-480B-A35B shapes, a {m['n_layers']}-layer slice (d_model {m['d_model']}, "
          f"{m['n_heads']}x{m['head_dim']} query / {m['n_kv_heads']} KV heads, {m['n_experts']} experts of d_ff "
          f"{m['d_ff_expert']}, top-{m['top_k']}, Q4_0), {box_bytes / GiB:.0f} GiB box, raw best {best:.2f} GB/s")
    ref = runs.get("zipf 0, cache smallest")
    ref_bpt = ref["decode"]["bytes"] / ref["decode"]["passes"] if ref and "error" not in ref else None
    for key, r in runs.items():
        if "error" in r:
            print(f"  {key}: FAILED: {r['error']}")
            continue
        plan, dc, ex = r["plan"], r["decode"], r.get("experts") or {}
        bpt, tok_s = dc["bytes"] / dc["passes"], dc["passes"] / dc["s"]
        ideal = plan["streamed_bytes_per_token"]
        # the ideal: the streamed weights that are not experts, plus the experts not already cached
        others = ideal - MOE["n_layers"] * moe_token_bytes()[1]
        missed = ex.get("bytes_read", 0) / dc["passes"]
        hit = ex.get("hit_rate")
        layers = ", ".join(f"{k} {v['hit_rate']:.0%}" for k, v in sorted(ex.get("per_layer", {}).items())
                           if v.get("hit_rate") is not None)
        saved = f"; {fmt_gb(ref_bpt - bpt)} per token saved against the smallest cache" if ref_bpt and r is not ref \
            else ""
        print(f"  {key}: expert cache {fmt_gb(plan['expert_cache_bytes'])} (pinned {fmt_gb(plan['pinned_bytes'])}); "
              f"decode {dc['passes']} tokens {tok_s:.3f} tok/s, {fmt_gb(bpt)} read per token = {bpt / ideal:.3f} x "
              f"the streamed bytes with nothing cached, {bpt / max(others + missed, 1):.3f} x the non-expert ones + "
              f"the missed experts' [goal <= {BYTES_TARGET}: {mark(bpt <= BYTES_TARGET * (others + missed))}]"
              f"; read {dc['bytes'] / dc['s'] / GB:.2f} GB/s = {dc['bytes'] / dc['s'] / GB / best:.2f} x raw; expert "
              f"hit rate {'-' if hit is None else f'{hit:.1%}'} ({layers}){saved}; peak "
              f"{r['peak_bytes'] / GiB:.2f} GiB")
        bt = r.get("batch")
        if bt:
            bb = bt.get("batch_bytes_read_per_token")
            print(f"    batch {bt['batch']}: {bt['batch_decode_tok_s']:.3f} tok/s aggregate = "
                  f"{bt['batch_decode_tok_s'] / tok_s:.2f} x one sequence"
                  + (f"; {fmt_gb(bb)} read per generated token" if bb else ""))
    attn, experts, outside = moe_token_bytes()
    full = MOE_FULL_LAYERS * (attn + experts) + outside
    print(f"  {MOE_FULL_LAYERS}-layer extrapolation (not measured): {fmt_gb(attn + experts)} per layer and token "
          f"with nothing cached (attention {fmt_gb(attn)} + top-{m['top_k']} experts {fmt_gb(experts)}) + "
          f"{fmt_gb(outside)} lm_head = {fmt_gb(full)} per token: at the raw best <= {best * GB / full:.3f} tok/s; "
          f"with a hit rate h on the expert bytes <= {best:.2f} GB/s / ({fmt_gb(full)} - h x "
          f"{fmt_gb(MOE_FULL_LAYERS * experts)})")
    theirs = moe.get("llama_cpp")
    if theirs is None:
        return
    if "error" in theirs:
        print(f"  llama.cpp (zipf {zipf:g}): did not finish in the box: {theirs['error']}")
        return
    local = runs.get(f"zipf {zipf:g}, cache auto", {})
    how = "mmap, defaults" if theirs.get("repack", True) else "mmap, --no-repack"
    dec_io = theirs.get("decode_io_read_bytes")
    passes = local.get("decode", {}).get("passes") or 1
    ours = passes / local["decode"]["s"] if "decode" in local else None
    per = f", {fmt_gb(dec_io / passes)} read per decode token" if dec_io is not None else ""
    print(f"  llama.cpp {theirs.get('version', '?')} ({how}, zipf {zipf:g}): decode {theirs['decode_tok_s']:.3f} "
          f"tok/s{per}; peak {theirs['peak_bytes'] / GiB:.2f} GiB"
          + (f"; uaii / llama.cpp decode {ours / theirs['decode_tok_s']:.2f}x" if ours else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--box-gib", type=float, default=BOX_BYTES / GiB, help="the memory cgroup's limit (8 GiB)")
    ap.add_argument("--prompt-tokens", type=int, default=16, help="prompt of the prefill and decode runs (16)")
    ap.add_argument("--gen-tokens", type=int, default=3, help="decode passes measured per run (3)")
    ap.add_argument("--batch", type=int, default=4, help="sequences decoding together (4; 1 skips the batch run)")
    ap.add_argument("--batch-prompt-tokens", type=int, default=8, help="each batch sequence's prompt (8)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--raw-gb", type=float, default=2.0,
                    help="GB read per raw-rate setting (at most 2: each reads its own stretch of the model file)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp runs")
    ap.add_argument("--models", default="dense,moe", help="comma-separated: dense, moe (both)")
    ap.add_argument("--moe-zipf", type=float, default=MOE_ZIPF,
                    help=f"router popularity exponent of the MoE locality slice ({MOE_ZIPF:g}; see synth_gguf)")
    ap.add_argument("--moe-gen-tokens", type=int, default=8, help="MoE decode passes measured per run (8)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per run, seconds")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(uaii_worker(spec)))
        return 0
    why = memory_box.available()
    if why is not None:
        print(f"bench-scale: cannot run: {why}")
        return 1
    box = int(args.box_gib * GiB)
    models = {m.strip() for m in args.models.split(",") if m.strip()}
    if not models or models - {"dense", "moe"}:
        ap.error(f"--models: dense, moe; found {args.models!r}")
    result: dict[str, Any] = {}
    if "dense" in models:
        result.update(run_dense(box, args))
    if "moe" in models:
        result["moe"] = moe = run_moe(box, args)
        report_moe(moe, box, args.moe_zipf)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def run_dense(box: int, args: argparse.Namespace) -> dict[str, Any]:
    """The dense model: raw rates, UAII, llama.cpp, and the report."""
    model = dense_model(quiet=False)
    print(f"bench-scale: {model.name} ({fmt_gb(model.stat().st_size)}), box {box / GiB:.1f} GiB, "
          f"{args.threads} threads, "
          f"prompt {args.prompt_tokens}, {args.gen_tokens} decode tokens", flush=True)
    raw = raw_rates(model, int(args.raw_gb * GB))
    print(f"raw disk best: {raw['best_gbps']:.2f} GB/s at {raw['best']}", flush=True)
    spec = {"path": str(model), "prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
            "batch": args.batch, "batch_prompt_tokens": args.batch_prompt_tokens, "threads": args.threads}
    ours = in_box(box, [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)], args.timeout)
    print(f"uaii: done in {ours['wall_s']:.0f} s", flush=True)
    theirs = None
    if not args.no_llama_cpp and "error" not in ours:
        theirs = llama_beside(box, model, ours, args)
        print(f"llama.cpp: {'did not finish' if 'error' in theirs else 'finished'}", flush=True)
    report(raw, ours, theirs, box)
    return {"raw": raw, "uaii": ours, "llama_cpp": theirs}


if __name__ == "__main__":
    sys.exit(main())
