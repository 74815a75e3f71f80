"""Pipeline stages on Ray (`make bench-ray`): one machine's streaming against several machines' RAM.

On the synthetic 4 GB llama (bench/synth_gguf.py, Llama-2-7B shapes, 32 layers, Q4_0, written once into the model
cache), the same greedy decode two ways:

1. one process with a 1 GiB budget (``--budget-gib``): most weights stream from disk every token. It runs in a
   fresh memory cgroup of ``--box-gib`` (bench/memory_box.py: the page cache counts, so the streamed bytes come
   from the disk as on a machine with that much RAM) after the page cache is dropped;
2. ``--stages`` pipeline stages of ``--stage-budget-gib`` each (1.2 GiB: every weight pinned across the stages,
   checked from each stage's plan), each a Ray actor on its own node of a local multi-node cluster
   (``ray.cluster_utils.Cluster``, one CPU per node) on this machine.

It prints both decode rates and their ratio, the bytes crossing between stages per token, and the per-token cost
of the Ray hops: the pipeline's wall time per token less the time the stages spent in their passes, against the
same figure for the same stages called in one process (``pipeline_transport="local"``). Both runs must give the
same tokens. The stages here share one machine's cores and memory bus, so their compute is what one machine's
would be; on K machines each stage computes on its own, and each hop adds the network's latency (see the closing
lines it prints).

    make bench-ray
    uv run --no-sync python bench/bench_ray.py --gen-tokens 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import memory_box

GiB = 1 << 30
REPO = Path(__file__).resolve().parents[1]
SIZE_GB = 4.0
PROMPT = [1, 450, 7483, 310, 3444, 338]  # ids below the synthetic vocabulary


def model() -> Path:
    from synth_gguf import default_path, ensure_synth, layers_for, model_params

    params = model_params("llama", layers_for("llama", SIZE_GB))
    path = default_path("llama", SIZE_GB, "q4_0", params)
    ensure_synth(path, params, quiet=False)
    return path


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_context": args.max_context, "max_batch": 16, "kv_dtype": "f16", "n_threads": args.threads}


def decode(s: Any, gen: int) -> dict[str, Any]:
    """Prefill the prompt, then ``gen`` greedy tokens; the decode's rate and tokens."""
    res = s.generate(PROMPT, max_new_tokens=gen + 1, ignore_eos=True)
    return {"tokens": list(res.tokens), "decode_tok_s": res.stats.decode_tok_s, "decode_s": res.stats.decode_s,
            "passes": gen}


# ============================================================================ the streaming process (in its box)
def worker(spec: dict[str, Any]) -> dict[str, Any]:
    from uaii.runtime import Session

    t0 = time.perf_counter()
    with Session(spec["path"], budget_bytes=spec["budget"], **spec["options"]) as s:
        storage = s.plan.storage
        out: dict[str, Any] = {"load_s": time.perf_counter() - t0, "pinned_bytes": storage.pinned_bytes,
                               "streamed_bytes_per_token": storage.streamed_bytes_per_token}
        b0 = int(s.storage_stats().get("bytes_read", 0))
        out.update(decode(s, spec["gen"]))
        out["bytes_read"] = int(s.storage_stats().get("bytes_read", 0)) - b0
    return out


def streaming_run(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    spec = {"path": str(path), "budget": int(args.budget_gib * GiB), "gen": args.gen_tokens,
            "options": session_options(args)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    why = memory_box.available()
    if why is not None:
        print(f"bench-ray: no memory box ({why}): the streaming run's reads may come from the page cache, which "
              "makes it look faster than a machine of that RAM", flush=True)
        import subprocess

        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
        res: dict[str, Any] = {"boxed": False}
    else:
        dropped = memory_box.drop_caches()
        with memory_box.MemoryBox("uaii-ray", int(args.box_gib * GiB)) as box:
            proc = box.run(cmd, timeout=args.timeout, cwd=REPO)
            res = {"boxed": True, "peak_bytes": box.peak_bytes(), "cache_dropped": dropped}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench-ray: the streaming run failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return {**res, **json.loads(lines[-1])}


# ============================================================================ the stages
def stage_run(path: Path, args: argparse.Namespace, transport: str) -> dict[str, Any]:
    """The pipeline's decode; with it, the stages' busy time per token and the rest of the wall time (the hops)."""
    from uaii.runtime import Session
    from uaii.runtime.pipeline import crossing_bytes

    t0 = time.perf_counter()
    with Session(path, pipeline=args.stages, pipeline_transport=transport,
                 budget_bytes=int(args.stage_budget_gib * GiB), **session_options(args)) as s:
        load_s = time.perf_counter() - t0
        infos = s.pipeline
        decode(s, 2)  # warm: each stage's first passes
        before = s._exe.stats()
        out = decode(s, args.gen_tokens)
        after = s._exe.stats()
        # the decode's passes: one per generated token after the first (the first comes from the prefill)
        passes = after[0]["passes"] - before[0]["passes"]
        busy = sum(a["busy_s"] - b["busy_s"] for a, b in zip(after, before, strict=True))
        per_token_busy = busy / passes
        wall = 1.0 / out["decode_tok_s"]
        out.update({"load_s": load_s, "transport": transport, "busy_s_per_token": per_token_busy,
                    "other_s_per_token": wall - per_token_busy,
                    "stages": [{"first": i.first, "last": i.last, "host": i.host, "mode": i.mode,
                                "weight_bytes": i.weight_bytes, "pinned_bytes": i.pinned_bytes,
                                "streamed_bytes_per_token": i.streamed_bytes_per_token,
                                "sends_bytes_per_token": crossing_bytes(s.graph, i.sends)} for i in infos]})
    return out


def ray_run(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    from uaii.runtime.ray_support import import_ray

    ray = import_ray()  # `make bench-ray` runs under `uv run`: its workers must not (uaii.runtime.ray_support)
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": 100 << 20})
    try:
        for _ in range(args.stages - 1):
            cluster.add_node(num_cpus=1, object_store_memory=100 << 20)
        ray.init(address=cluster.address, log_to_driver=False)
        return stage_run(path, args, "ray")
    finally:
        ray.shutdown()
        cluster.shutdown()


# ============================================================================ the report
def report(stream: dict[str, Any], ray_res: dict[str, Any], local: dict[str, Any], args: argparse.Namespace) -> None:
    mb = 1e6
    boxed = f" in a {args.box_gib:g} GiB cgroup" if stream["boxed"] else ""
    print(f"\n1 process, budget {args.budget_gib:g} GiB{boxed}: "
          f"pinned {stream['pinned_bytes'] / mb:.0f} MB, streamed {stream['streamed_bytes_per_token'] / mb:.0f} MB per "
          f"token (read {stream['bytes_read'] / max(stream['passes'] + 1, 1) / mb:.0f} MB per pass): "
          f"{stream['decode_tok_s']:.2f} tok/s")
    print(f"{args.stages} stages on Ray, {args.stage_budget_gib:g} GiB each:")
    for i, st in enumerate(ray_res["stages"]):
        print(f"  stage {i}: layers {st['first']}-{st['last'] - 1}, {st['weight_bytes'] / mb:.0f} MB of weights, "
              f"{st['mode']}, pinned {st['pinned_bytes'] / mb:.0f} MB, streamed "
              f"{st['streamed_bytes_per_token'] / mb:.0f} MB/token, sends {st['sends_bytes_per_token']} B/token")
    all_pinned = all(st["streamed_bytes_per_token"] == 0 for st in ray_res["stages"])
    crossing = sum(st["sends_bytes_per_token"] for st in ray_res["stages"])
    ratio = ray_res["decode_tok_s"] / stream["decode_tok_s"]
    print(f"  decode {ray_res['decode_tok_s']:.2f} tok/s; everything pinned: {'yes' if all_pinned else 'NO'}; "
          f"{crossing} B cross between stages per token")
    print(f"ratio, {args.stages} stages vs 1 process: {ratio:.2f}x")
    same = ray_res["tokens"] == stream["tokens"] == local["tokens"]
    print(f"same tokens (1 process, Ray stages, local stages): {'yes' if same else 'NO'}")
    hops = args.stages  # K - 1 hops between stages, and the reply to the driver
    ray_extra, local_extra = ray_res["other_s_per_token"], local["other_s_per_token"]
    print(f"per token: stages busy {ray_res['busy_s_per_token'] * 1e3:.1f} ms; the rest {ray_extra * 1e3:.2f} ms on "
          f"Ray against {local_extra * 1e3:.2f} ms with the stages called in one process: the Ray hops cost "
          f"{(ray_extra - local_extra) * 1e3:.2f} ms per token ({(ray_extra - local_extra) / hops * 1e3:.2f} ms per "
          f"hop, {hops} hops)")
    print(f"on {args.stages} machines with a network round trip of L ms per hop: about "
          f"{ray_res['busy_s_per_token'] * 1e3:.0f} + {hops} x ({(ray_extra - local_extra) / hops * 1e3:.2f} + L) ms "
          f"per token (the hidden state is {crossing // max(args.stages - 1, 1)} B per hop: bandwidth is no factor); "
          "each stage's compute is its own machine's, so a pass is the sum of the stages' times")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--budget-gib", type=float, default=1.0, help="the single process's budget (1 GiB)")
    ap.add_argument("--box-gib", type=float, default=1.25, help="the single process's memory cgroup (1.25 GiB)")
    ap.add_argument("--stage-budget-gib", type=float, default=1.2, help="each stage's budget (1.2 GiB)")
    ap.add_argument("--gen-tokens", type=int, default=16, help="decode tokens measured (16)")
    ap.add_argument("--max-context", type=int, default=256, help="KV cache tokens (256)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, help="also write every figure here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    path = model()
    print(f"bench-ray: {path.name} ({path.stat().st_size / 1e9:.2f} GB), {args.gen_tokens} decode tokens, "
          f"{args.threads} threads", flush=True)
    stream = streaming_run(path, args)
    print(f"streaming: {stream['decode_tok_s']:.2f} tok/s", flush=True)
    ray_res = ray_run(path, args)
    print(f"ray stages: {ray_res['decode_tok_s']:.2f} tok/s", flush=True)
    local = stage_run(path, args, "local")
    print(f"local stages: {local['decode_tok_s']:.2f} tok/s", flush=True)
    report(stream, ray_res, local, args)
    if args.json:
        args.json.write_text(json.dumps({"streaming": stream, "ray": ray_res, "local": local}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
