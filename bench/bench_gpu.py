"""The WebGPU backend on whatever adapter this machine has (`make bench-gpu`), against references from the same run.

1. The adapter: name, backend, driver, whether it is a software one, and the date.
2. GEMV GB/s per weight type on the layer shapes of SmolLM2-135M and Gemma-3-270M (weight bytes read per second,
   ``uaii.backends.webgpu.measure.gemv_bandwidth``), next to the adapter's own buffer-copy bandwidth measured now
   (``copy_bandwidth``): the ratio says how close a GEMV comes to what the device can move at all.
3. Prefill and decode tok/s of SmolLM2 and Gemma-3 on webgpu next to the CPU backend, each run as
   ``uaii bench --json`` in its own process (a driver crash or an op the backend does not lower yet is that row's
   error, never the end of the benchmark), with the same prompt, tokens and KV cache (f32, unbounded) on both.

0. First, where a CUDA device exists (and uaii-backends[cuda] is installed), the CUDA backend (``--cuda-only``: this
   part alone): its GEMV kernels per type (weight GB/s) against a device-to-device copy measured in the same run
   (goal >= 0.7 for Q4), the int8 prefill GEMM's TOPS, prefill/decode tok/s of both models on cuda (``uaii bench
   --device cuda``, each in its own process), and SmolLM2 under a 24 MiB device budget and a synthetic llama
   (bench/synth_gguf.py, 1 GB written here; ``--quick`` 0.5 GB) under a quarter of its bytes: the streamed bytes of a
   decode step per second against the page-locked host -> device copy measured in the same run (goal >= 0.8);
   and that synthetic llama's decode tok/s with each step replayed as one CUDA graph against every kernel launched
   from Python (``cuda_graphs=False``), same run, same greedy tokens.

On a software adapter (lavapipe) the numbers only show that everything runs: it is the CPU emulating a GPU.

    python bench/bench_gpu.py             # every type and shape, 128-token prompt, 32 generated tokens
    python bench/bench_gpu.py --quick     # a few types, SmolLM2's shapes, 32-token prompt, 8 tokens
    python bench/bench_gpu.py --no-models # GEMV and copy only
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # bench_models, also when this file is loaded by path (its tests)
from bench_models import GEMV_SHAPES, model_path  # noqa: E402

SHAPES = GEMV_SHAPES
QUICK_SHAPES = ["smollm2 ffn_up/gate", "smollm2 ffn_down", "smollm2 lm_head"]
TYPES = ["f32", "f16", "bf16", "q8_0", "q6_k", "q5_0", "q4_k", "q4_1", "q4_0"]
QUICK_TYPES = ["f16", "q8_0", "q4_k", "q4_0"]
MODELS = {"smollm2": "SmolLM2-135M Q4_1", "gemma3": "Gemma-3-270M Q4_K_M"}
DEVICES = ("cpu", "webgpu")
MiB = 1 << 20

Runner = Callable[[list[str], float], dict[str, Any]]


# ---------------------------------------------------------------------------------------------------- adapter
def open_gpu() -> tuple[Any, str]:
    """The device the webgpu backend runs on (a software adapter too: this benchmark runs wherever it can), or
    None and why there is none."""
    try:
        from uaii.backends.webgpu.device import open_device

        return open_device(allow_software=True), ""
    except Exception as exc:  # no wgpu, no adapter: said, not raised
        return None, str(getattr(exc, "reason", "") or exc)


def adapter_line(info: Any, when: datetime.datetime | None = None) -> str:
    """``webgpu:0 NAME (Vulkan, DiscreteGPU) · driver ... · 24.0 GiB · 2025-01-01T12:00:00``."""
    from uaii.runtime.presets import format_bytes

    when = when or datetime.datetime.now()
    soft = " · SOFTWARE adapter: the numbers only show that it runs" if info.software else ""
    memory = format_bytes(info.memory) if info.memory else "memory not reported"
    return (f"{info.describe()} · vendor {info.vendor or '-'} · driver {info.driver or '-'} · {memory} · "
            f"{when.isoformat(timespec='seconds')}{soft}")


# ------------------------------------------------------------------------------------------------------- GEMV
def load_measure() -> tuple[Any, str]:
    """uaii.backends.webgpu.measure (copy_bandwidth, gemv_bandwidth), or None and why it cannot be used."""
    try:
        from uaii.backends.webgpu import measure
    except ImportError as exc:
        return None, f"uaii.backends.webgpu.measure is not available ({exc})"
    return measure, ""


def gemv_rows(dev: Any, measure: Any, types: list[str], shapes: list[tuple[str, int, int]], reps: int,
              copy_gb_s: float) -> list[dict[str, Any]]:
    """One row per (type, shape): GB/s of weight bytes read, its ratio to ``copy_gb_s``, or the error. A shape
    whose k is not a whole number of the type's blocks (q4_k on k = 576) has no row: no model has that weight."""
    from uaii.ir.dtype import DType

    rows = []
    for t in types:
        for name, k, n in shapes:
            if k % DType(t).block_size:
                continue
            row: dict[str, Any] = {"dtype": t, "shape": name, "k": k, "n": n}
            try:
                gb_s = float(measure.gemv_bandwidth(dev, DType(t), n, k, reps))
                row.update(gb_s=gb_s, ratio=gb_s / copy_gb_s if copy_gb_s > 0 else None)
            except Exception as exc:  # one type failing (a kernel not written yet) is that row's error
                row["error"] = first_line(exc)
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------- models
def run_json(cmd: list[str], timeout: float) -> dict[str, Any]:
    """The last stdout line of ``cmd`` as JSON, or ``{"error": ...}`` with the last line it printed."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        return {"error": tail[0].removeprefix("error: ")}
    try:
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": "no JSON on stdout"}


def bench_command(path: Path, device: str, prompt_tokens: int, gen_tokens: int) -> list[str]:
    """``uaii bench`` of one model on one device; both devices with the same f32, unbounded KV cache."""
    cmd = [sys.executable, "-m", "uaii.runtime.cli", "bench", str(path), "--json", "--device", device,
           "--prompt-tokens", str(prompt_tokens), "--gen-tokens", str(gen_tokens), "--kv-dtype", "f32",
           "--kv-window", "0"]
    return [*cmd, "--allow-software-adapter"] if device == "webgpu" else cmd


def model_rows(keys: list[str], prompt_tokens: int, gen_tokens: int, timeout: float,
               find: Callable[[str], Path], runner: Runner = run_json,
               devices: tuple[str, ...] = DEVICES) -> list[dict[str, Any]]:
    """One row per (model, device): prefill/decode tok/s, or the error (a model that cannot be found, a run that
    fails)."""
    rows = []
    for key in keys:
        label = MODELS[key]
        try:
            path = find(key)
        except Exception as exc:
            rows += [{"model": label, "device": d, "error": f"model not found: {first_line(exc)}"} for d in devices]
            continue
        for device in devices:
            print(f"[bench-gpu] {label} on {device} ...", file=sys.stderr, flush=True)
            res = runner(bench_command(path, device, prompt_tokens, gen_tokens), timeout)
            rows.append({**res, "model": label, "device": device})
    return rows


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ------------------------------------------------------------------------------------------------------ report
def render(adapter: str, copy_gb_s: float | None, gemv: list[dict[str, Any]], gemv_note: str,
           models: list[dict[str, Any]], out: Any = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(file=out, width=max(120, int(os.environ.get("COLUMNS", "0") or 0)), highlight=False)
    con.print(f"adapter: {escape(adapter)}")
    if copy_gb_s is not None:
        con.print(f"buffer copy (copy_buffer_to_buffer, bytes read + written): {copy_gb_s:.2f} GB/s")
    if gemv_note:
        con.print(f"GEMV: {escape(gemv_note)}")
    if gemv:
        t = Table(title="GEMV on the device: weight GB/s, and its ratio to the buffer copy's GB/s (read + write) of "
                  "this adapter", title_justify="left")
        for col in ("type", "shape", "k x n", "GB/s", "ratio", "note"):
            t.add_column(col, justify="right" if col in ("GB/s", "ratio") else "left", no_wrap=col != "note",
                         overflow="fold")
        for r in gemv:
            if "error" in r:
                t.add_row(r["dtype"], r["shape"], f"{r['k']} x {r['n']}", "-", "-",
                          f"[red]failed: {escape(r['error'])}[/red]")
                continue
            ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
            t.add_row(r["dtype"], r["shape"], f"{r['k']} x {r['n']}", f"{r['gb_s']:.2f}", ratio, "")
        con.print(t)
    if models:
        con.print(model_table(models))


def model_table(rows: list[dict[str, Any]]) -> Any:
    """prefill/decode tok/s per model and device; the webgpu row's ratios are webgpu / cpu."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title="generation: webgpu vs the CPU backend, same run (ratio = webgpu / cpu; > 1: webgpu faster)",
              title_justify="left")
    for col in ("model", "device", "prefill tok/s", "decode tok/s", "prefill ratio", "decode ratio"):
        t.add_column(col, justify="left" if col in ("model", "device") else "right", no_wrap=col != "prefill tok/s")
    cpu = {r["model"]: r for r in rows if r["device"] == "cpu" and "error" not in r}
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], r["device"], f"[red]failed: {escape(r['error'])}[/red]", "", "", "")
            continue
        ref = cpu.get(r["model"]) if r["device"] != "cpu" else None
        ratios = [_ratio(r.get(k), ref.get(k)) if ref else "" for k in ("prefill_tok_s", "decode_tok_s")]
        t.add_row(r["model"], r["device"], f"{r['prefill_tok_s']:.1f}", f"{r['decode_tok_s']:.1f}", *ratios)
    return t


def _ratio(ours: Any, ref: Any) -> str:
    return f"{float(ours) / float(ref):.2f}x" if ours and ref else "-"


# -------------------------------------------------------------------------------------------------------- main
def measure_gpu(dev: Any, args: argparse.Namespace) -> tuple[float | None, list[dict[str, Any]], str]:
    """(copy GB/s, GEMV rows, a note when the GEMV part could not run)."""
    measure, why = load_measure()
    if measure is None:
        return None, [], why
    try:
        copy = float(measure.copy_bandwidth(dev, (16 if args.quick else 64) * MiB, 5 if args.quick else 20))
    except Exception as exc:
        return None, [], f"the copy bandwidth could not be measured: {first_line(exc)}"
    shapes = [s for s in SHAPES if not args.quick or s[0] in QUICK_SHAPES]
    types = QUICK_TYPES if args.quick else TYPES
    return copy, gemv_rows(dev, measure, types, shapes, 3 if args.quick else 10, copy), ""


CUDA_TYPES = ["q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q6_k"]
CUDA_SHAPES = [("4096x4096", 4096, 4096), ("14336x4096", 14336, 4096), ("152064x5120", 152064, 5120)]


def measure_cuda(quick: bool, models: bool = True, kernels: bool = True) -> dict[str, Any] | None:
    """The CUDA backend's kernels on the first CUDA device: device-to-device copy GB/s and GEMV GB/s per type and
    shape (weight bytes read per second, uaii.backends.cuda.measure) with their ratio to the copy (issue #18's goal
    for Q4 types: >= 0.7), for the int8 form a decode step runs and the float form (gemm="f32"). None, said on
    stderr, without cuda-bindings or a device. ``kernels`` False: the copy
    bandwidths only (what the models' streaming row is compared with)."""
    try:
        from uaii.backends.cuda import measure
        from uaii.backends.cuda.device import CudaDevice, device_count
    except ImportError as exc:
        print(f"bench-gpu: CUDA part skipped ({exc}): pip install 'uaii-backends[cuda]'", file=sys.stderr)
        return None
    if device_count() == 0:
        print("bench-gpu: no CUDA device: CUDA part skipped", file=sys.stderr)
        return None
    from uaii.ir import DType

    shapes = CUDA_SHAPES[:1] if quick else CUDA_SHAPES
    types = CUDA_TYPES[:2] if quick else CUDA_TYPES
    with CudaDevice.open() as dev:
        copy = measure.copy_bandwidth(dev, 256 * MiB, 20)
        h2d = measure.h2d_bandwidth(dev, 256 * MiB, 10)
        rows = []
        for t in types if kernels else []:
            for name, n, k in shapes:  # the int8 form is what a decode step runs; the float form beside it
                gb = measure.gemv_bandwidth(dev, DType(t), n, k, 20, int8=True)
                gb_f = measure.gemv_bandwidth(dev, DType(t), n, k, 20)
                rows.append({"type": t, "shape": name, "gb_s": gb, "x_copy": gb / copy, "float_gb_s": gb_f,
                             "float_x_copy": gb_f / copy})
        mmq = [{"type": t, "shape": "4096x4096", "rows": m, "tops": measure.mmq_rate(dev, DType(t), 4096, 4096, m)}
               for t in (types if kernels else []) for m in (64, 512)]
        out = {"device": dev.name, "capability": list(dev.capability), "arch": dev.arch, "copy_gb_s": copy,
               "h2d_gb_s": h2d, "gemv": rows, "mmq": mmq, "date": datetime.date.today().isoformat()}
    print(f"CUDA: {out['device']} ({out['arch']}), {out['date']}; device-to-device copy (bytes read + written) "
          f"{copy:.0f} GB/s; page-locked host -> device {h2d:.1f} GB/s")
    for r in rows:
        print(f"  GEMV {r['type']:5s} {r['shape']:12s} int8 {r['gb_s']:7.0f} GB/s  {r['x_copy']:.2f}x copy;  "
              f"float {r['float_gb_s']:7.0f} GB/s  {r['float_x_copy']:.2f}x")
    for r in mmq:
        print(f"  int8 GEMM {r['type']:5s} {r['shape']} x {r['rows']:3d} rows {r['tops']:6.1f} TOPS")
    if not kernels:
        return out if not models else _cuda_streaming(out, h2d, quick)
    try:
        out["synthetic_streaming"] = synthetic_streaming(h2d, quick)
    except Exception as exc:  # gguf not installed, no disk room: that row's error, the rest stands
        out["synthetic_streaming"] = {"error": first_line(exc)}
        print(f"  streaming a synthetic model: not measured ({first_line(exc)})")
    try:
        out["graphs"] = graphs_row(synthetic_llama(0.5 if quick else 1.0)[0], "synthetic llama", quick)
    except Exception as exc:
        out["graphs"] = {"error": first_line(exc)}
        print(f"  CUDA graphs: not measured ({first_line(exc)})")
    return _cuda_streaming(out, h2d, quick) if models else out


def _cuda_streaming(out: dict[str, Any], h2d: float, quick: bool) -> dict[str, Any]:
    """SmolLM2 under a 24 MiB device budget (streaming_row) into ``out``."""
    try:
        out["streaming"] = streaming_row(model_path("smollm2"), MODELS["smollm2"], h2d, quick, 24 * MiB)
    except Exception as exc:  # no model file on this machine (a lent GPU reaches no hub), or a failed run
        out["streaming"] = {"error": first_line(exc)}
        print(f"  streaming: not measured ({first_line(exc)})")
    return out


def synthetic_streaming(h2d: float, quick: bool, size_gb: float | None = None) -> dict[str, Any]:
    """Issue #18's "synthetic model larger than an artificially small device budget": a llama of Llama-3-8B layer
    shapes with random Q4_0 weights (bench/synth_gguf.py, written on this machine — a lent GPU reaches no hub and a
    call carries 64 MiB) under a device budget of a quarter of its bytes, so three quarters stream every step."""
    import synth_gguf  # bench/ is on sys.path (above)

    size = size_gb if size_gb is not None else (0.5 if quick else 1.0)
    path, params = synthetic_llama(size)
    budget = synth_gguf.model_bytes(params) // 4
    return streaming_row(path, f"synthetic llama {params['n_layers']}L Q4_0 ({size:g} GB)", h2d, quick, budget)


def synthetic_llama(size_gb: float) -> tuple[Path, dict[str, Any]]:
    """The synthetic llama of ``size_gb`` (Llama-3-8B layer shapes, random Q4_0), written once on this machine, and
    its parameters."""
    import synth_gguf

    params = synth_gguf.model_params("llama", synth_gguf.layers_for("llama", size_gb))
    path = synth_gguf.default_path("llama", size_gb, params=params)
    synth_gguf.ensure_synth(path, params)
    return Path(path), params


def graphs_row(path: Path, label: str, quick: bool) -> dict[str, Any]:
    """Decode steps of ``path``, resident on the device, with the step's kernels replayed as one CUDA graph and
    launched one by one from Python (``cuda_graphs=False``), in the same run: what the launch overhead costs a
    token (uaii.backends.cuda.executable's module doc). The greedy tokens of the two must agree."""
    import time

    import numpy as np

    from uaii.backends import get_backend
    from uaii.backends.testing import greedy_steps
    from uaii.loaders import load_model
    from uaii.storage import MmapStore

    steps = 16 if quick else 64
    model = load_model(path)
    out: dict[str, Any] = {"model": label, "steps": steps}
    tokens = {}
    with MmapStore(model.weights) as store:
        backend = get_backend("cuda")
        for graphs in (False, True):
            exe = backend.compile(model.graph, None, store, max_tokens=16, cuda_graphs=graphs)
            try:
                run = greedy_steps(exe, exe.new_state(steps + 16), [1, 2, 3, 4, 5])
                seq = [int(np.argmax(next(run)[-1])) for _ in range(3)]  # the prompt, the eager run, the capture
                start = time.perf_counter()
                seq += [int(np.argmax(next(run)[-1])) for _ in range(steps)]
                out["graph_tok_s" if graphs else "launch_tok_s"] = steps / (time.perf_counter() - start)
                tokens[graphs] = seq
                if graphs:
                    out["graph_launches"] = exe.graph_launches
            finally:
                exe.close()
    out["x_launches"] = out["graph_tok_s"] / out["launch_tok_s"]
    out["same_tokens"] = tokens[True] == tokens[False]
    print(f"  CUDA graphs, {label} decode: {out['graph_tok_s']:.1f} tok/s replayed, {out['launch_tok_s']:.1f} tok/s "
          f"launched kernel by kernel ({out['x_launches']:.2f}x); same tokens: {out['same_tokens']}")
    return out


def streaming_row(path: Path, label: str, h2d: float, quick: bool, budget_bytes: int) -> dict[str, Any]:
    """``path`` resident and under a device budget of ``budget_bytes`` (the rest streams through the staging slots
    every step): decode tok/s of both, and the streamed bytes per second of a decode step against the page-locked
    copy bandwidth (issue #18's goal: >= 0.8)."""
    import time

    import numpy as np

    from uaii.runtime import Session

    steps = 8 if quick else 32
    out: dict[str, Any] = {"model": label, "h2d_gb_s": h2d, "budget_bytes": budget_bytes}
    for name, extra in (("resident", {}), ("streamed", {"gpu_budget_bytes": budget_bytes})):
        with Session(path, device="cuda", plan_cache=False, max_context=256, max_batch=32, **extra) as s:
            logits = s.forward(s.tokenize("The capital of France is"))
            t = int(np.argmax(logits))
            start = time.perf_counter()
            for _ in range(steps):
                t = int(np.argmax(s.forward([t])))
            per_step = (time.perf_counter() - start) / steps
            out[f"{name}_tok_s"] = 1 / per_step
            if extra:
                res = s.device_residency
                out["streamed_bytes"] = res.streamed_bytes if res is not None else 0
                out["effective_h2d_gb_s"] = out["streamed_bytes"] / per_step / 1e9
                out["x_h2d"] = out["effective_h2d_gb_s"] / h2d if h2d else 0.0
    print(f"  streaming {label}: resident {out['resident_tok_s']:.1f} tok/s, under a {budget_bytes / MiB:.0f} MiB "
          f"device budget {out['streamed_tok_s']:.1f} tok/s streaming {out['streamed_bytes'] / MiB:.0f} MiB a step = "
          f"{out['effective_h2d_gb_s']:.1f} GB/s ({out['x_h2d']:.2f}x the page-locked copy)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a few types and shapes, 32-token prompt, 8 tokens")
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    ap.add_argument("--no-models", action="store_true", help="GEMV and copy bandwidth only")
    ap.add_argument("--no-gemv", action="store_true", help="the models only (with --cuda-only: the copy bandwidths "
                    "and the models on cuda)")
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--gen-tokens", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per model and device")
    ap.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    ap.add_argument("--cuda-only", action="store_true", help="the CUDA kernels' bandwidth only (needs a CUDA device)")
    args = ap.parse_args(argv)
    prompt = args.prompt_tokens or (32 if args.quick else 128)
    gen = args.gen_tokens or (8 if args.quick else 32)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    cuda = (None if args.no_gemv and not args.cuda_only
            else measure_cuda(args.quick, models=not args.no_models, kernels=not args.no_gemv))
    if cuda is not None and not args.no_models:
        cuda["models"] = model_rows(keys, prompt, gen, args.timeout, model_path, devices=("cuda",))
        for r in cuda["models"]:
            print(f"  {r['model']} on cuda: " + (r["error"] if "error" in r else
                  f"prefill {r.get('prefill_tok_s', 0):.0f} tok/s, decode {r.get('decode_tok_s', 0):.1f} tok/s"))
    if args.cuda_only:
        if args.json:
            Path(args.json).write_text(json.dumps({"cuda": cuda}, indent=2))
        return 0 if cuda is not None else 1
    dev, why = open_gpu()
    if dev is None:
        print(f"bench-gpu: no WebGPU device: {why}", file=sys.stderr)
        return 1
    copy, gemv, note = (None, [], "") if args.no_gemv else measure_gpu(dev, args)
    models: list[dict[str, Any]] = []
    if not args.no_models:
        models = model_rows(keys, prompt, gen, args.timeout, model_path)
    print(f"prompt {prompt} tokens, decode {gen} tokens greedy, KV cache f32 unbounded; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    render(adapter_line(dev.info), copy, gemv, note, models)
    if args.json:
        Path(args.json).write_text(json.dumps({"adapter": dev.info.as_dict(), "copy_gb_s": copy, "gemv": gemv,
                                               "models": models, "cuda": cuda}, indent=2))
    failed = [r for r in [*gemv, *models] if "error" in r]
    return 1 if failed or note else 0


if __name__ == "__main__":
    sys.exit(main())
