"""Generation benchmark: `uaii bench` on the real models against llama.cpp, measured side by side in this run, and
transformers.

For SmolLM2-135M (Q4_1) and Gemma-3-270M (Q4_K_M), fetched into the model cache by scripts/models.py, in each setting
(a ~512-token prompt + 128 greedy tokens at 2 threads; the same at 1 thread; a 4,096-token prompt, i.e. decode at 4k
of context):

* uaii: ``uaii bench MODEL --json`` (its own process; f16 KV cache, no window): prefill tok/s of the prompt, greedy
  decode tok/s, peak RSS, load time;
* llama.cpp through llama-cpp-python, built from its sdist into a benchmark-only environment (bench/llama_cpp_env.py:
  the native build, or one with the ISA spelled out where the native one crashes), the same prompt ids, threads,
  context and KV type (f16) — runs alternate with uaii's and each figure is the median of ``--repeat`` runs;
* transformers on CPU (the GGUF dequantized to f32, ``torch.set_num_threads``), once per model, first setting only.

The table gives every engine's figures and uaii's ratio to them (> 1: uaii is faster / for RSS, uses more). No
figure is recorded from another run or machine.

    uv run --no-sync python bench/bench_generate.py                  # both models, every setting, 3 runs each
    uv run --no-sync python bench/bench_generate.py --quick          # 128 + 32 tokens, 2 threads, 1 run
    uv run --no-sync python bench/bench_generate.py --models smollm2 --settings 2t --no-transformers --json out.json
"""

from __future__ import annotations

import argparse
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

MODELS = {"smollm2": "SmolLM2-135M Q4_1", "gemma3": "Gemma-3-270M Q4_K_M"}
SETTINGS = {"2t": (512, 128, 2), "1t": (512, 128, 1), "4k": (4096, 128, 2)}
"""name -> (prompt tokens, generated tokens, threads)."""
METRICS = ("load_s", "prefill_tok_s", "decode_tok_s", "peak_rss_bytes")


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
def run_uaii(path: Path, prompt: int, gen: int, threads: int, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "uaii.runtime.cli", "bench", str(path), "--json", "--threads", str(threads),
           "--prompt-tokens", str(prompt), "--gen-tokens", str(gen), "--kv-dtype", "f16", "--kv-window", "0"]
    return _run_json(cmd, timeout)


def _with_ids(ids: list[int], run: Any) -> dict[str, Any]:
    ids_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"uaii-bench-ids-{os.getpid()}.json"
    ids_file.write_text(json.dumps(ids))
    try:
        return dict(run(ids_file))
    finally:
        ids_file.unlink(missing_ok=True)


def run_transformers(path: Path, ids: list[int], gen: int, threads: int, timeout: float) -> dict[str, Any]:
    return _with_ids(ids, lambda f: _run_json(
        [sys.executable, __file__, "--worker", "transformers", "--model", str(path), "--ids-file", str(f),
         "--gen-tokens", str(gen), "--threads", str(threads)], timeout))


def run_llama_cpp(python: Path, path: Path, ids: list[int], gen: int, threads: int,
                  timeout: float) -> dict[str, Any]:
    from llama_cpp_env import WORKER

    return _with_ids(ids, lambda f: _run_json(
        [str(python), str(WORKER), str(path), str(f), "--gen-tokens", str(gen), "--threads", str(threads)], timeout))


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each metric over the runs that succeeded; the first error when none did."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    out = {k: v for k, v in ok[0].items() if k not in METRICS}
    for k in METRICS:
        vals = sorted(float(r[k]) for r in ok if r.get(k) is not None)
        if vals:
            mid = len(vals) // 2
            out[k] = vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2
    out["runs"] = len(ok)
    return out


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


WORKERS = {"transformers": worker_transformers}


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
    for col in ("model", "setting", "engine", "load", "prefill tok/s", "decode tok/s", "peak RSS", "prefill ratio",
                "decode ratio", "RSS ratio"):
        t.add_column(col, justify="left" if col in ("model", "setting", "engine") else "right", no_wrap=True)
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["setting"], r["engine"], "", f"[red]failed: {r['error']}[/red]", "", "", "", "",
                      "")
            continue
        ours = r["ours"]
        is_ours = r["engine"] == "uaii"
        t.add_row(r["model"], r["setting"], r["engine"], f"{r['load_s']:.2f} s" if r.get("load_s") else "-",
                  f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}", f"{r['peak_rss_bytes'] / MiB:.0f} MiB",
                  *(("",) * 3 if is_ours else (ratio(ours.get("prefill_tok_s"), r["prefill_tok_s"]),
                                               ratio(ours.get("decode_tok_s"), r["decode_tok_s"]),
                                               ratio(ours.get("peak_rss_bytes"), r["peak_rss_bytes"]))))
    Console(width=max(160, int(os.environ.get("COLUMNS", "0") or 0))).print(t)


def bench_model(key: str, args: argparse.Namespace, llama: Path | None) -> list[dict[str, Any]]:
    path = model_path(key)
    label, rows = MODELS[key], []
    for n, setting in enumerate(args.settings):
        prompt, gen, threads = SETTINGS[setting]
        if args.quick:
            prompt, gen = 128, 32
        desc = f"{prompt}+{gen}, {threads} thr"
        ids = prompt_ids(path, prompt)
        ours_runs: list[dict[str, Any]] = []
        theirs_runs: list[dict[str, Any]] = []
        for i in range(args.repeat):  # alternating, so a busy moment costs both engines alike
            print(f"[bench] {label} {desc}: run {i + 1}/{args.repeat} uaii"
                  + (" + llama.cpp" if llama else ""), file=sys.stderr, flush=True)
            ours_runs.append(run_uaii(path, prompt, gen, threads, args.timeout))
            if llama is not None:
                theirs_runs.append(run_llama_cpp(llama, path, ids, gen, threads, args.timeout))
        ours = median_of(ours_runs)
        rows.append({**ours, "model": label, "setting": desc, "engine": "uaii", "ours": ours})
        if "error" not in ours and ours.get("stopped_early"):
            print(f"[bench] note: uaii stopped after {ours['new_tokens']} tokens ({ours['finish_reason']})",
                  file=sys.stderr)
        if llama is not None:
            rows.append({**median_of(theirs_runs), "model": label, "setting": desc, "engine": "llama.cpp",
                         "ours": ours})
        if n == 0 and not args.no_transformers:
            print(f"[bench] {label} {desc}: transformers ...", file=sys.stderr, flush=True)
            res = run_transformers(path, ids, gen, threads, args.timeout)
            rows.append({**res, "model": label, "setting": desc, "engine": "transformers", "ours": ours})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="128-token prompt, 32 generated tokens, 2 threads, 1 run")
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    known = ", ".join(f"{k} ({p}+{g} tokens, {t} threads)" for k, (p, g, t) in SETTINGS.items())
    ap.add_argument("--settings", default=None, help=f"comma-separated: {known} (default: all; --quick: 2t)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per engine and setting, alternating (3)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (and its build)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per engine run")
    ap.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    ap.add_argument("--gen-tokens", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        ids = json.loads(Path(args.ids_file).read_text())
        print(json.dumps(WORKERS[args.worker](Path(args.model), ids, args.gen_tokens, args.threads)))
        return 0
    args.settings = [s.strip() for s in (args.settings or ("2t" if args.quick else ",".join(SETTINGS))).split(",")]
    args.repeat = args.repeat or (1 if args.quick else 3)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS] + [s for s in args.settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown model(s) or setting(s) {', '.join(unknown)}; models: {', '.join(MODELS)}; settings: "
                 f"{', '.join(SETTINGS)}")
    llama: Path | None = None
    llama_note = "llama.cpp skipped (--no-llama-cpp)"
    if not args.no_llama_cpp:
        from llama_cpp_env import ensure

        llama, flavor = ensure(model_path(keys[0]))
        llama_note = f"llama.cpp: llama-cpp-python, {flavor} build" if llama else f"llama.cpp: {flavor}"
    rows = [row for key in keys for row in bench_model(key, args, llama)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (a busy machine slows every engine, transformers most); "
          f"medians of {args.repeat} alternating runs; {llama_note}")
    render(rows)
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "ours"} for r in rows], indent=2))
    return 1 if any("error" in r for r in rows if r["engine"] == "uaii") else 0


if __name__ == "__main__":
    sys.exit(main())
