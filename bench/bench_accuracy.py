"""Accuracy of the default GEMM against the exact one, beside llama.cpp's (`make bench-accuracy`).

What users see of the quantized activations of the default (``gemm="fast"``) mode (8-bit; 16-bit for the output
projection's Q8_0 weights) is how far its next-token distributions are from the exact ones. For SmolLM2-135M and
Gemma-3-270M over a fixed English text (~400 tokens, :data:`TEXT`):

* the exact distributions: our ``gemm="f32"`` mode (weights dequantized, float32 dot products) over one batched
  pass — the reference of every figure below;
* ours: the mean KL(exact || default mode) on the prefill path (one batched pass: every position's logits) and on
  the decode path (one token at a time), and the largest |prefill - decode| logit difference of a position;
* llama.cpp: the same KL from the same reference on both paths (every position's logits of one batched eval, then
  one token at a time), fed our token ids, with an f32 KV cache like ours (its f16 default would add its own error).

llama.cpp comes from llama-cpp-python (pinned below), built from source in a virtual environment of its own under
``$UAII_CACHE_DIR`` (never in the product nor in the test environment): AVX-512 chosen explicitly with
``GGML_NATIVE=OFF``, since ``-march=native`` enables AMX on Xeons whose VM does not, and the build dies with SIGILL.
The first run builds it (minutes); when that fails the script says so and prints our figures alone.

Goal (printed as met/missed): our KL <= llama.cpp's on both paths of both models, and our prefill and decode
agree to 0.05 logits. It also lists the rows significantly worse than llama.cpp's and counts those significantly
better (paired difference of the per-position KL beyond 2 standard errors).

    python bench/bench_accuracy.py                  # both models, ~400 tokens, 2 threads
    python bench/bench_accuracy.py --models gemma3 --no-llama
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = "0.3.36"
LLAMA_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
                    "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF")
MODELS = {"smollm2": "SmolLM2-135M Q4_1", "gemma3": "Gemma-3-270M Q4_K_M"}

TEXT = (
    "The first railways were built to carry coal, not people. Horses pulled wagons along wooden rails from the pits "
    "to the rivers, and the rails were there only because a wheel rolls more easily on a smooth track than on a "
    "muddy road. When the steam engine became small enough to move itself, engineers put it on those tracks, and "
    "within a generation the railway had changed how far a person could travel in a day. Towns that had been a "
    "week apart were suddenly a morning apart. Clocks had to agree, so that a timetable meant the same thing at "
    "both ends of a line, and the local noon of every village gave way to a standard time kept by the telegraph. "
    "Farmers could sell milk in cities that had never seen their cows, newspapers printed in the capital arrived "
    "in the provinces before they were stale, and families that had lived in one valley for centuries scattered "
    "across a continent. Not everyone welcomed the change. Landowners objected to lines cutting across their "
    "fields, coaching inns lost their trade, and doctors warned that the human body was not made to move at "
    "thirty miles an hour. Accidents were frequent and sometimes terrible, because brakes, signals and the rules "
    "for running trains safely were invented only after the trains themselves. Each disaster produced a new "
    "regulation: interlocking levers so that a signalman could not set two trains on the same track, continuous "
    "brakes that stopped every carriage at once, and block sections that allowed only one train on a stretch of "
    "line at a time. Over a century these rules turned a dangerous novelty into one of the safest ways to travel. "
    "Today the same questions return with every new technology: who pays for the track, who decides where it "
    "goes, how safety is proven before the public relies on it, and what happens to the people whose work it "
    "replaces. The answers are rarely found by engineers alone, and they are never found all at once. A railway "
    "is a promise that a train will come, on time and in one piece, for as long as anyone can remember; keeping "
    "that promise takes patient work that nobody notices until it stops, and it is the same with every system "
    "that people learn to take for granted."
)


# --- numbers --------------------------------------------------------------------------------------------------
def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_rows(ref_logp: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, p = exp(ref_logp) (the exact distributions), q = softmax(logits); 32 rows at a time
    (Gemma-3's vocabulary is 262144 wide)."""
    out = np.empty(len(logits))
    for i in range(0, len(logits), 32):
        q = log_softmax(logits[i:i + 32])
        p = np.asarray(ref_logp[i:i + 32], np.float64)
        out[i:i + 32] = (np.exp(p) * (p - q)).sum(axis=-1)
    return out


def score(ref_logp: np.ndarray, pre: np.ndarray, decode_rows: Iterable[np.ndarray]) -> dict[str, Any]:
    """KL from the exact distributions of every position's logits of one batched pass (``pre``) and of the decode
    path (``decode_rows``: one row per position, in order), and the largest |prefill - decode| logit difference;
    the same figures for both engines."""
    kl_pre = kl_rows(ref_logp, pre)
    kl_dec, diff = np.empty(len(pre)), np.empty(len(pre))
    for i, row in enumerate(decode_rows):
        kl_dec[i] = kl_rows(ref_logp[i:i + 1], row[None])[0]
        diff[i] = np.abs(row - pre[i]).max()
    return {"prefill": kl_pre.tolist(), "decode": kl_dec.tolist(), "max_diff": float(diff.max())}


# --- ours -----------------------------------------------------------------------------------------------------
def all_logits(path: Path, ids: list[int], gemm: str, kv: str) -> np.ndarray:
    """Every position's logits from one batched pass over ``ids`` through a KV cache of type ``kv``, as a Session's
    prefill runs it (the Session keeps only the last position's logits, so this compiles the model's full graph)."""
    from uaii.backends import get_backend
    from uaii.runtime.model import load_bundle
    from uaii.storage import MmapStore

    bundle = load_bundle(path)
    exe = get_backend("cpu").compile(bundle.graph, None, MmapStore(bundle.locations), max_tokens=len(ids), gemm=gemm)
    state = exe.new_state(len(ids), **({"dtype": kv} if kv != "f32" else {}))
    out = exe.run({"tokens": np.array(ids, np.int64), "positions": np.arange(len(ids))}, state)
    return np.asarray(out["logits"], np.float32).reshape(len(ids), -1)


def reference(path: Path, n_tokens: int, threads: int, ref_file: Path) -> list[int]:
    """The exact distributions (our f32 mode, f32 KV cache) saved to ``ref_file`` as log-probabilities; the ids."""
    from uaii.runtime import Session

    with Session(path, n_threads=threads) as s:
        ids = list(s.tokenize(TEXT)[:n_tokens])
    np.save(ref_file, log_softmax(all_logits(path, ids, "f32", "f32")).astype(np.float32))
    return ids


def ours(path: Path, ids: list[int], kv: str, threads: int, ref_file: Path) -> dict[str, Any]:
    """Our default GEMM mode's KL from the reference on both paths, with a ``kv`` (f32 or f16) KV cache."""
    from uaii.runtime import Session

    ref = np.load(ref_file, mmap_mode="r")
    pre = all_logits(path, ids, "fast", kv)
    with Session(path, gemm="fast", kv_dtype=kv, n_threads=threads) as s:
        return score(ref, pre, (s.forward([t]) for t in ids))


# --- llama.cpp (runs in its own venv: numpy and llama_cpp only) ------------------------------------------------
def llama_worker(model: str, ids_file: str, ref_file: str, kv: str, threads: int) -> dict[str, Any]:
    import llama_cpp

    ids = json.loads(Path(ids_file).read_text())
    ref = np.load(ref_file, mmap_mode="r")
    n = len(ids)
    ggml_type = {"f32": 0, "f16": 1}[kv]
    llm = llama_cpp.Llama(model_path=model, n_ctx=n + 8, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, type_k=ggml_type, type_v=ggml_type,
                          verbose=False)
    llm.eval(ids)                                                          # one batched pass: every position
    pre = np.array(llm.scores[:n], np.float32)
    llm.reset()

    def decode_rows() -> Iterable[np.ndarray]:
        for i, t in enumerate(ids):
            llm.eval([t])
            yield np.array(llm.scores[i], np.float32)

    return {**score(ref, pre, decode_rows()), "system": llama_cpp.llama_print_system_info().decode().strip()}


def llama_python(venv: Path) -> tuple[Path | None, str]:
    """The llama.cpp venv's python, built on first use; (None, why) when it cannot be had."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return py, ""
    print(f"building llama-cpp-python {LLAMA_CPP_PYTHON} from source into {venv} (minutes; once) ...", flush=True)
    env = {**os.environ, "CMAKE_ARGS": LLAMA_CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    uv = os.environ.get("UV") or shutil.which("uv") or "uv"         # `make` and `uv run` name theirs in $UV
    steps = [[uv, "venv", "-q", "-p", sys.executable, str(venv)],
             [uv, "pip", "install", "-q", "--python", str(py), "numpy", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"]]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{' '.join(cmd[1:3])}: {exc}"
        if proc.returncode != 0:
            return None, f"{' '.join(cmd[1:3])} failed: {(proc.stderr or proc.stdout).strip()[-300:]}"
    return py, ""


def llama(py: Path, path: Path, ids: list[int], kv: str, threads: int, ref_file: Path) -> dict[str, Any]:
    ids_file = ref_file.with_suffix(".ids.json")
    ids_file.write_text(json.dumps(ids))
    cmd = [str(py), str(Path(__file__).resolve()), "--llama-worker", str(path), str(ids_file), str(ref_file), kv,
           "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[-400:]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# --- report ---------------------------------------------------------------------------------------------------
def compare(ours_kl: list[float], theirs_kl: list[float] | None) -> tuple[str, str, bool]:
    """Ratio of the means, the paired difference of the per-position KL in standard errors, and whether ours is
    not larger. The positions are the same for both engines, so the paired error is the one that says whether a
    difference is more than the luck of which activations happen to round which way."""
    if theirs_kl is None:
        return "n/a", "n/a", True
    o, t = np.asarray(ours_kl), np.asarray(theirs_kl)
    d = o - t
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
    return f"{o.mean() / t.mean():.2f}", f"{d.mean() / se:+.1f}", bool(o.mean() <= t.mean())


def render(rows: list[dict[str, Any]], llama_note: str) -> bool:
    print("| model | path | ours KL(exact ‖ default) | llama.cpp KL(exact ‖ llama.cpp) | ours / llama.cpp | "
          "paired difference / its s.e. | max abs(prefill - decode), ours | llama.cpp |")
    print("|---|---|---|---|---|---|---|---|")
    met = True
    z_of: dict[str, str] = {}                           # "label path" -> the paired difference / its s.e.
    for r in rows:
        for p in ("prefill", "decode"):
            theirs = r["llama"].get(p)
            ratio, z, ok = compare(r["ours"][p], theirs)
            z_of[f"{r['label']} {p}"] = z
            met &= ok
            lc = f"{np.mean(theirs):.5f}" if theirs is not None else "n/a"
            print(f"| {r['label']} | {p} | {np.mean(r['ours'][p]):.5f} | {lc} | {ratio} | {z} | "
                  f"{r['ours']['max_diff']:.3g} | {r['llama'].get('max_diff', float('nan')):.3g} |")
        met &= r["ours"]["max_diff"] <= 0.05
    have_llama = all("prefill" in r["llama"] for r in rows)
    if not have_llama:
        print(f"llama.cpp: {llama_note or 'not measured'}")
    verdict = "met" if met and have_llama else ("missed" if not met else "not decided (no llama.cpp figures)")
    print(f"goal (ours <= llama.cpp on both paths of every row; prefill and decode within 0.05): {verdict}")
    if have_llama:
        worse = [name for name, z in z_of.items() if float(z) >= 2.0]
        print("significantly worse than llama.cpp (paired difference >= 2 s.e.): " + (", ".join(worse) or "no row"))
        better = [name for name, z in z_of.items() if float(z) <= -2.0]
        print(f"significantly better (paired difference <= -2 s.e.): {len(better)} of {2 * len(rows)} rows")
        print(f"llama.cpp build: {rows[0]['llama'].get('system', '?')}")
    return met


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    ap.add_argument("--tokens", type=int, default=400, help="positions of the text measured (400)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama", action="store_true", help="our figures only")
    ap.add_argument("--llama-venv", type=Path, default=None,
                    help=f"llama-cpp-python's venv (default: $UAII_CACHE_DIR/llamacpp-venv-{LLAMA_CPP_PYTHON})")
    ap.add_argument("--kv", default="f32,f16", help="KV cache types, both engines alike (f32: as our Session's "
                    "default; f16: our CLI presets' and llama.cpp's default)")
    ap.add_argument("--llama-worker", nargs=4, metavar=("MODEL", "IDS", "REF", "KV"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        model, ids_file, ref_file, kv = args.llama_worker
        print(json.dumps(llama_worker(model, ids_file, ref_file, kv, args.threads)))
        return 0
    sys.path.insert(0, str(REPO / "bench"))
    from bench_models import model_path

    from uaii.backends.cpu.backend import cpu_name
    from uaii.kernels import get_isa, set_num_threads

    set_num_threads(args.threads)
    cache = Path(os.environ.get("UAII_CACHE_DIR", Path.home() / ".cache" / "uaii"))
    py, note = (None, "--no-llama") if args.no_llama else llama_python(
        args.llama_venv or cache / f"llamacpp-venv-{LLAMA_CPP_PYTHON}")
    print(f"{datetime.date.today()}, cpu: {cpu_name()}, {os.cpu_count()} logical cores, uaii kernels {get_isa()}, "
          f"{args.threads} threads; llama-cpp-python {LLAMA_CPP_PYTHON if py else 'unavailable'}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models.split(","):
            path = model_path(key)
            ref_file = Path(tmp) / f"{key}.ref.npy"
            ids = reference(path, args.tokens, args.threads, ref_file)
            for kv in args.kv.split(","):
                o = ours(path, ids, kv, args.threads, ref_file)
                lc = llama(py, path, ids, kv, args.threads, ref_file) if py else {}
                if "error" in lc:
                    note = f"{key}: {lc.pop('error')}"
                rows.append({"label": f"{MODELS.get(key, key)}, {len(ids)} tokens, {kv} KV", "ours": o, "llama": lc})
    render(rows, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
