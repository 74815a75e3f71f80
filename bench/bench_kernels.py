"""GEMV / GEMM throughput of uaii.kernels per weight type on the layer shapes of SmolLM2-135M and Gemma-3-270M.

Everything is measured in one run and printed as ratios against two references from that same run:
  (a) numpy's f32 matmul (its BLAS) on the dequantized weight, with the same number of threads;
  (b) the machine's memory bandwidth, from a STREAM-like copy (bytes read + written per second).
GEMV reads the packed weights "cold": it cycles through enough copies of the weight to overflow the last-level
cache, as a decode step that streams a whole model does, calling the C entry point with bound arguments as the CPU
backend does. GEMM multiplies 512 rows (prefill).

    python bench/bench_kernels.py            # full table
    python bench/bench_kernels.py --quick    # a short run (a few types and shapes)
    python bench/bench_kernels.py --accuracy # also the accuracy table of docs/kernels.md
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
from bench_models import GEMV_SHAPES

import uaii.kernels as K
from uaii.ir.dtype import DType
from uaii.kernels import native
from uaii.kernels.accuracy import gemm_accuracy
from uaii.kernels.testing import random_weight

SHAPES = GEMV_SHAPES
QUICK_SHAPES = ["smollm2 ffn_up/gate", "smollm2 ffn_down", "gemma3 ffn_down", "smollm2 lm_head"]
TYPES = ["f32", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "iq4_nl", "iq4_xs",
         "mxfp4", "q3_k", "q2_k"]
QUICK_TYPES = ["q8_0", "q4_k", "q4_1", "q4_0"]
GEMM_ROWS = 512
COLD_BYTES = 96 << 20          # GEMV cycles through at least this many bytes of weight copies


# --- numpy's BLAS: which kernel, how many threads ---------------------------------------------------------------
class Blas:
    """numpy's OpenBLAS through threadpoolctl when installed, else through the bundled library (ctypes)."""

    def __init__(self) -> None:
        self.info = "unknown (np.show_config() below)"
        self._set: Callable[[int], None] | None = None
        try:
            import threadpoolctl

            infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
            if infos:
                i = infos[0]
                self.info = f"{i.get('internal_api')} {i.get('version')} core={i.get('architecture')}"
                self._set = lambda n: threadpoolctl.threadpool_limits(n, user_api="blas")
                return
        except ImportError:
            pass
        libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
        for path in libs:
            lib = ctypes.CDLL(path)
            for pre, suf in (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", "")):
                try:
                    cfg, core = getattr(lib, f"{pre}get_config{suf}"), getattr(lib, f"{pre}get_corename{suf}")
                    setn = getattr(lib, f"{pre}set_num_threads{suf}")
                except AttributeError:
                    continue
                cfg.restype = core.restype = ctypes.c_char_p
                self.info = f"{cfg().decode()} | kernel: {core().decode()}"
                self._set = lambda n, f=setn: f(ctypes.c_int(n))  # type: ignore[misc]
                return

    def set_threads(self, n: int) -> None:
        if self._set is not None:
            self._set(n)


# --- timing -------------------------------------------------------------------------------------------------------
def best_time(fn: Callable[[], Any], min_time: float, repeats: int = 5) -> float:
    """Best (lowest) mean time per call over `repeats` batches of ~min_time/repeats seconds each."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    per_batch = max(1, int(min_time / repeats / once))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        best = min(best, (time.perf_counter() - t0) / per_batch)
    return best


def timed(threads: int, blas: Blas, fn: Callable[[], Any], min_time: float) -> float:
    """best_time with our pool and numpy's BLAS both sized to `threads`."""
    with K.num_threads(threads):
        blas.set_threads(threads)
        return best_time(fn, min_time)


def settle() -> None:
    """Let idle BLAS / pool threads stop spinning, so that one library's waiting threads do not take the cores
    the other one measures with (OpenBLAS spins for a while after each call, like most BLAS)."""
    time.sleep(0.25)


def make_weight(dt: DType, n: int, k: int, rng: np.random.Generator) -> K.PackedWeight:
    if dt in K.QUANT_TYPES and dt not in (DType.F32,):
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        return K.PackedWeight.from_raw(K.quantize(w, dt), dt, (n, k))
    return K.PackedWeight.from_raw(random_weight(dt, n, k), dt, (n, k))


def cold_copies(w: K.PackedWeight) -> list[K.PackedWeight]:
    count = max(1, min(64, math.ceil(COLD_BYTES / w.nbytes)))
    return [w] + [K.PackedWeight.from_raw(w.data.copy(), w.dtype, (w.n, w.k)) for _ in range(count - 1)]


def cycler(ws: list[K.PackedWeight], x: np.ndarray, out: np.ndarray) -> Callable[[], Any]:
    """One GEMV per call on the next weight copy, through ``uk_gemm`` with its arguments bound once, as the CPU
    backend calls it (uaii.backends.cpu.ops_fast): the kernel's time plus a cffi call (~0.4 us), not the ~2 us of
    argument checks of the Python IGemm wrapper, which the runtime does not pay per token."""
    ffi, lib = native.ffi, native.lib
    x2 = np.ascontiguousarray(x, np.float32).reshape(1, -1)
    xp, yp = ffi.cast("float *", ffi.from_buffer(x2)), ffi.cast("float *", ffi.from_buffer(out))
    calls = [partial(lib.uk_gemm, w.dtype.gguf_id, w.pointer(), w.n, w.k, xp, 1, w.k, yp, w.n, 0) for w in ws]
    keep = (x2, out)
    state = [0]

    def run() -> None:
        i = state[0] = (state[0] + 1) % len(calls)
        if calls[i]() != 0:
            raise RuntimeError(f"uk_gemm failed on copy {i} of {keep[0].shape}")

    return run


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """Competing processes that spin on the CPU (as other jobs on a shared machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.3)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --- sections -----------------------------------------------------------------------------------------------------
def environment(blas: Blas) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    print(f"cpu: {cpu}, {os.cpu_count()} logical cores; uaii.kernels ISA {K.get_isa()} "
          f"(available: {', '.join(K.available_isas())})")
    print(f"numpy {np.__version__}; BLAS: {blas.info}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '-')}")
    if blas.info.startswith("unknown"):
        np.show_config()


def gemv_table(shapes: list[tuple[str, int, int]], types: list[str], threads: list[int], bw: dict[int, float],
               blas: Blas, min_time: float, rng: np.random.Generator) -> dict[tuple[str, str, int], float]:
    print("\n## GEMV (decode, 1 row, weights cold) — GB/s of packed weight read; ratio to the copy bandwidth; "
          "speed-up over numpy f32 on the dequantized weight")
    print(f"| shape (k x n) | type | {' | '.join(f'{t} thr GB/s | /bw | x numpy' for t in threads)} |")
    print("|---|---|" + "---|---|---|" * len(threads))
    results: dict[tuple[str, str, int], float] = {}
    for name, k, n in shapes:
        x = rng.standard_normal((1, k)).astype(np.float32)
        y = np.empty((1, n), np.float32)
        for tname in types:
            dt = DType.parse(tname)
            if k % dt.block_size:
                continue
            w = make_weight(dt, n, k, rng)
            ws = cold_copies(w)
            wf = w.dequantize()
            run_ours = cycler(ws, x, y)

            def run_numpy(x: np.ndarray = x, wf: np.ndarray = wf) -> Any:
                return np.matmul(x, wf.T)

            tk = {t: timed(t, blas, run_ours, min_time) for t in threads}
            settle()                                       # numpy's BLAS threads spin a while after a call
            tn = {t: timed(t, blas, run_numpy, min_time) for t in threads}
            settle()
            cells = []
            for t in threads:
                gbs = w.nbytes / tk[t] / 1e9
                results[(name, tname, t)] = gbs / bw[t]
                cells.append(f"{gbs:6.1f} | {gbs / bw[t]:4.2f} | {tn[t] / tk[t]:5.2f}")
            print(f"| {name} ({k}x{n}) | {tname} | {' | '.join(cells)} |", flush=True)
            del ws, wf
    return results


SMALL_M = (1, 2, 4, 8)         # a batched decode step: one row per sequence


def small_batch_table(threads: list[int], reps: int, rng: np.random.Generator) -> None:
    """Per-step cost of uk_gemm at 1, 2, 4 and 8 rows on SmolLM2's shapes in the mode each layer uses (Q4_1 in mode 0;
    the Q8_0 lm_head in mode 2, 16-bit activations), weights cold, the row counts timed round-robin (load from
    elsewhere hits all alike), median. A ratio near 1 means the extra rows ride on weight bytes read once."""
    print(f"\n## Small batches (batched decode, weights cold) — us per step at m rows; ratio to m = 1 (median of "
          f"{reps})")
    print(f"| shape (k x n) | type, mode | thr | {' | '.join(f'm={m}' for m in SMALL_M)} |")
    print("|---|---|---|" + "---|" * len(SMALL_M))
    ffi, lib = native.ffi, native.lib
    for name, k, n in [s for s in SHAPES if s[0].startswith("smollm2")]:
        dt, mode = (DType.Q8_0, 2) if "lm_head" in name else (DType.Q4_1, 0)
        ws = cold_copies(make_weight(dt, n, k, rng))
        xs = {m: rng.standard_normal((m, k)).astype(np.float32) for m in SMALL_M}
        ys = {m: np.empty((m, n), np.float32) for m in SMALL_M}
        ptr = {m: (ffi.cast("float *", ffi.from_buffer(xs[m])), ffi.cast("float *", ffi.from_buffer(ys[m])))
               for m in SMALL_M}
        calls = {m: [partial(lib.uk_gemm, w.dtype.gguf_id, w.pointer(), n, k, ptr[m][0], m, k, ptr[m][1], n, mode)
                     for w in ws] for m in SMALL_M}
        for t in threads:
            times: dict[int, list[float]] = {m: [] for m in SMALL_M}
            with K.num_threads(t):
                for r in range(reps + 2):
                    for m in SMALL_M:
                        call = calls[m][(r * len(SMALL_M) + m) % len(ws)]
                        t0 = time.perf_counter()
                        call()
                        if r >= 2:
                            times[m].append(time.perf_counter() - t0)
            med = {m: float(np.median(v)) * 1e6 for m, v in times.items()}
            cells = " | ".join(f"{med[m]:7.1f} (x{med[m] / med[1]:.2f})" for m in SMALL_M)
            print(f"| {name} ({k}x{n}) | {dt.value}, mode {mode} | {t} | {cells} |", flush=True)
        del ws


def gemm_table(shapes: list[tuple[str, int, int]], types: list[str], threads: list[int], blas: Blas,
               min_time: float, rng: np.random.Generator) -> None:
    print(f"\n## GEMM (prefill, {GEMM_ROWS} rows) — GFLOP/s; speed-up over numpy f32 BLAS on the dequantized weight")
    print(f"| shape (k x n) | type | {' | '.join(f'{t} thr GFLOP/s | x numpy' for t in threads)} |")
    print("|---|---|" + "---|---|" * len(threads))
    for name, k, n in shapes:
        if n > 65536:
            continue                                       # a 512 x 262144 output is not a prefill shape
        x = rng.standard_normal((GEMM_ROWS, k)).astype(np.float32)
        y = np.empty((GEMM_ROWS, n), np.float32)
        flops = 2.0 * GEMM_ROWS * n * k
        for tname in types:
            dt = DType.parse(tname)
            if k % dt.block_size:
                continue
            w = make_weight(dt, n, k, rng)
            wf = w.dequantize()
            yn = np.empty_like(y)
            def run_ours(x: np.ndarray = x, w: K.PackedWeight = w, y: np.ndarray = y) -> Any:
                return K.matmul(x, w, out=y)

            def run_numpy(x: np.ndarray = x, wf: np.ndarray = wf, yn: np.ndarray = yn) -> Any:
                return np.matmul(x, wf.T, out=yn)

            tk = {t: timed(t, blas, run_ours, min_time) for t in threads}
            settle()
            tn = {t: timed(t, blas, run_numpy, min_time) for t in threads}
            settle()
            cells = [f"{flops / tk[t] / 1e9:6.1f} | {tn[t] / tk[t]:5.2f}" for t in threads]
            print(f"| {name} ({k}x{n}) | {tname} | {' | '.join(cells)} |", flush=True)


def busy_line(min_time: float, rng: np.random.Generator) -> None:
    _, k, n = SHAPES[4]
    w = make_weight(DType.Q4_0, n, k, rng)
    ws = cold_copies(w)
    x = rng.standard_normal((1, k)).astype(np.float32)
    y = np.empty((1, n), np.float32)
    print("\n## GEMV under load (q4_0, gemma3 ffn_down, 2 threads): a competing busy process per core")
    with K.num_threads(2):
        quiet = best_time(cycler(ws, x, y), min_time)
        rows = [("idle machine", quiet)]
        for count in (1, 2):
            with busy_processes(count):
                rows.append((f"{count} busy process{'es' if count > 1 else ''}", best_time(cycler(ws, x, y), min_time)))
    print("| condition | us per GEMV | GB/s | slow-down |")
    print("|---|---|---|---|")
    for label, t in rows:
        print(f"| {label} | {t * 1e6:7.1f} | {w.nbytes / t / 1e9:5.1f} | {t / quiet:5.2f} |")


def accuracy_table() -> None:
    print("\n## Accuracy of c-q8dot against the f32 path (x . W^T of the dequantized W, f64), k = 2048")
    print("| type | path | max rel. error | mean rel. error |")
    print("|---|---|---|---|")
    for tname in TYPES:
        a = gemm_accuracy(DType.parse(tname))
        print(f"| {tname} | {a.path} | {a.max_rel:.2e} | {a.mean_rel:.2e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run: a few types and shapes, shorter timings")
    ap.add_argument("--accuracy", action="store_true", help="also print the accuracy table")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    ap.add_argument("--types", default=None, help="weight types, comma-separated")
    ap.add_argument("--no-busy", action="store_true", help="skip the run with competing busy processes")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    types = args.types.split(",") if args.types else (QUICK_TYPES if args.quick else TYPES)
    shapes = [s for s in SHAPES if not args.quick or s[0] in QUICK_SHAPES]
    min_time = 0.15 if args.quick else 0.5
    rng = np.random.default_rng(0)
    blas = Blas()
    environment(blas)
    bw = {t: 0.0 for t in threads}
    for t in threads:
        with K.num_threads(t):
            bw[t] = K.copy_bandwidth((128 if args.quick else 256) << 20, min_time)
    print("memory bandwidth (STREAM-like copy, read + write): "
          + ", ".join(f"{bw[t]:.1f} GB/s at {t} thread{'s' if t > 1 else ''}" for t in threads))
    ratios = gemv_table(shapes, types, threads, bw, blas, min_time, rng)
    small_batch_table(threads, 30 if args.quick else 100, rng)
    gemm_table(shapes, types, threads, blas, min_time, rng)
    if not args.no_busy:
        busy_line(min_time, rng)
    if args.accuracy:
        accuracy_table()
    goal = [(s, t) for (s, t, th), r in ratios.items() if th == max(threads) and t in ("q4_0", "q4_1", "q4_k")
            and r < 0.7]
    print(f"\nGEMV goal (q4_0/q4_1/q4_k >= 0.7 of the copy bandwidth at {max(threads)} threads): "
          + ("met" if not goal else f"missed for {goal}"))


if __name__ == "__main__":
    main()
