"""Generation benchmark: `uaii bench` on the real models against transformers (and llama-cpp-python if installed).

For SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M), fetched into the model cache by scripts/models.py:

* uaii: ``uaii bench MODEL --json`` (its own process): prefill of a ~512-token prompt built from a fixed text,
  greedy decode of 128 tokens, peak RSS, load time;
* transformers on CPU, in the same run and its own process: the GGUF loaded with ``gguf_file=`` (dequantized to
  f32), ``torch.set_num_threads(2)``, prefill of the same token ids and greedy decode of 128 tokens with its KV
  cache (EOS ignored);
* llama-cpp-python, when importable (not in the default install), the same way;
* llama.cpp figures recorded on this machine (not measured by this run; labelled "recorded"):
  SmolLM2 Q4_1 prefill 410 tok/s, decode 142 tok/s, RSS 227 MiB; Gemma-3 Q4_K_M prefill 992, decode 92, 405 MiB.

The table gives every engine's figures and uaii's ratio to them (> 1: uaii is faster / for RSS, uses more).

    uv run --no-sync python bench/bench_generate.py            # both models, 512 + 128 tokens, 2 threads
    uv run --no-sync python bench/bench_generate.py --quick    # 128 + 32 tokens
    uv run --no-sync python bench/bench_generate.py --models smollm2 --no-transformers --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_models import model_path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# llama.cpp on this machine (2 threads), recorded once: prefill tok/s, decode tok/s, peak RSS bytes.
RECORDED = {
    "smollm2": {"label": "SmolLM2-135M Q4_1", "prefill_tok_s": 410.0, "decode_tok_s": 142.0,
                "peak_rss_bytes": 227 * MiB},
    "gemma3": {"label": "Gemma-3-270M Q4_K_M", "prefill_tok_s": 992.0, "decode_tok_s": 92.0,
               "peak_rss_bytes": 405 * MiB},
}


def prompt_ids(path: Path, n_tokens: int) -> list[int]:
    """The ids `uaii bench` measures with: the fixed benchmark text, BOS first where the model adds one."""
    from uaii.runtime.cli.bench import bench_prompt_ids
    from uaii.tokenizers import load

    tok = load(path)
    bos = tok.bos_id if tok.add_bos else None
    return bench_prompt_ids(lambda t: tok.encode(t, add_special=False), n_tokens, bos)


def _run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # local files only, never a hub
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------------------------------- engines
def run_uaii(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "uaii.runtime.cli", "bench", str(path), "--json", "--threads", str(args.threads),
           "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
    return _run_json(cmd, args.timeout)


def run_worker(engine: str, path: Path, ids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    ids_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"uaii-bench-ids-{os.getpid()}.json"
    ids_file.write_text(json.dumps(ids))
    try:
        cmd = [sys.executable, __file__, "--worker", engine, "--model", str(path), "--ids-file", str(ids_file),
               "--gen-tokens", str(args.gen_tokens), "--threads", str(args.threads)]
        return _run_json(cmd, args.timeout)
    finally:
        ids_file.unlink(missing_ok=True)


def _peak_rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def worker_transformers(path: Path, ids: list[int], gen_tokens: int, threads: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    x = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        model(x[:, :8], use_cache=True)  # warm-up
        t0 = time.perf_counter()
        out = model(x, use_cache=True)
        prefill_s = time.perf_counter() - t0
        past = out.past_key_values
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = time.perf_counter()
        for _ in range(gen_tokens):  # greedy, EOS ignored: every step is one decode
            out = model(token, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": gen_tokens / decode_s,
            "peak_rss_bytes": _peak_rss(), "version": __import__("transformers").__version__}


def worker_llama_cpp(path: Path, ids: list[int], gen_tokens: int, threads: int) -> dict[str, Any]:
    import llama_cpp

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(path), n_threads=threads, n_threads_batch=threads, n_batch=len(ids),
                          n_ctx=len(ids) + gen_tokens + 16, verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(ids[:8])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(gen_tokens):
        token = llm.sample(temp=0.0)
        llm.eval([token])
    decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": gen_tokens / decode_s,
            "peak_rss_bytes": _peak_rss(), "version": llama_cpp.__version__}


WORKERS = {"transformers": worker_transformers, "llama-cpp-python": worker_llama_cpp}


# ----------------------------------------------------------------------------------------------------- table
def ratio(ours: Any, theirs: Any) -> str:
    if not ours or not theirs:
        return "-"
    return f"{float(ours) / float(theirs):.2f}x"


def render(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="generation: uaii vs references (ratios are uaii / engine; > 1 = uaii faster, for RSS larger)",
              title_justify="left")
    for col in ("model", "engine", "load", "prefill tok/s", "decode tok/s", "peak RSS", "prefill ratio",
                "decode ratio", "RSS ratio"):
        t.add_column(col, justify="left" if col in ("model", "engine") else "right", no_wrap=True)
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["engine"], "", f"[red]failed: {r['error']}[/red]", "", "", "", "", "")
            continue
        ours = r["ours"]
        is_ours = r["engine"] == "uaii"
        t.add_row(r["model"], r["engine"], f"{r['load_s']:.2f} s" if r.get("load_s") else "-",
                  f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}", f"{r['peak_rss_bytes'] / MiB:.0f} MiB",
                  *(("",) * 3 if is_ours else (ratio(ours.get("prefill_tok_s"), r["prefill_tok_s"]),
                                               ratio(ours.get("decode_tok_s"), r["decode_tok_s"]),
                                               ratio(ours.get("peak_rss_bytes"), r["peak_rss_bytes"]))))
    Console(width=max(150, int(os.environ.get("COLUMNS", "0") or 0))).print(t)


def bench_model(key: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    path = model_path(key)
    label = RECORDED[key]["label"]
    print(f"[bench] {label}: uaii ...", file=sys.stderr, flush=True)
    ours = run_uaii(path, args)
    rows = [{**ours, "model": label, "engine": "uaii", "ours": ours}]
    if "error" not in ours and ours.get("stopped_early"):
        print(f"[bench] note: uaii stopped after {ours['new_tokens']} tokens ({ours['finish_reason']})",
              file=sys.stderr)
    ids = prompt_ids(path, args.prompt_tokens)
    engines = [] if args.no_transformers else ["transformers"]
    if importlib.util.find_spec("llama_cpp") is not None:
        engines.append("llama-cpp-python")
    for engine in engines:
        print(f"[bench] {label}: {engine} ...", file=sys.stderr, flush=True)
        res = run_worker(engine, path, ids, args)
        rows.append({**res, "model": label, "engine": engine, "ours": ours})
    rec = RECORDED[key]
    rows.append({"model": label, "engine": "llama.cpp (recorded)", "ours": ours, "load_s": None,
                 **{k: rec[k] for k in ("prefill_tok_s", "decode_tok_s", "peak_rss_bytes")}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="128-token prompt, 32 generated tokens")
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--gen-tokens", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine and model")
    ap.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.prompt_tokens = args.prompt_tokens or (128 if args.quick else 512)
    args.gen_tokens = args.gen_tokens or (32 if args.quick else 128)
    if args.worker:
        ids = json.loads(Path(args.ids_file).read_text())
        print(json.dumps(WORKERS[args.worker](Path(args.model), ids, args.gen_tokens, args.threads)))
        return 0
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in RECORDED]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(RECORDED)}")
    rows = [row for key in keys for row in bench_model(key, args)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"prompt {args.prompt_tokens} tokens, decode {args.gen_tokens} tokens greedy, {args.threads} threads, "
          f"{os.cpu_count()} CPUs, load average {load} (a busy machine slows every engine, transformers most); "
          "llama.cpp rows are figures recorded on this machine, not measured now")
    render(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "ours"} for r in rows], indent=2))
    return 1 if any("error" in r for r in rows if r["engine"] == "uaii") else 0


if __name__ == "__main__":
    sys.exit(main())
