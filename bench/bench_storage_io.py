"""Streaming-store read bandwidth against raw sequential O_DIRECT reads of the same file.

    uv run --no-sync python bench/bench_storage_io.py [--size-mib 1024] [--repeat 3]

A test file (1 GiB of random bytes by default) is written once to $UAII_CACHE_DIR/bench (default
~/.cache/uaii/bench) and reused. Both sides read it with O_DIRECT, so the page cache does not flatter either
of them (the page cache cannot be dropped globally without root; O_DIRECT bypasses it):

* raw: one thread, sequential ``preadv`` of 8 MiB blocks into an aligned buffer (as ``dd iflag=direct``);
* raw-qd: the same with 4 threads at queue depth 4 (2 MiB blocks), the device's parallel ceiling;
* store: ``StreamingStore`` streaming the same bytes as tensors of 1–50 MiB at unaligned offsets, everything
  prefetched in order, each tensor acquired and released as a compute loop would.

Prints the median GB/s of each over --repeat rounds (the order alternates between rounds) and the median of
the per-round ratios store / raw sequential; the target is >= 0.85. Exit status 1 below target.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from statistics import median

import numpy as np

from uaii.ir import DType
from uaii.storage import StreamingStore, WeightLocation

MiB = 1 << 20
GB = 1e9


def bench_file(size: int) -> Path:
    root = Path(os.environ.get("UAII_CACHE_DIR", Path.home() / ".cache" / "uaii")) / "bench"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"storage_io_{size // MiB}mib.bin"
    if path.exists() and path.stat().st_size == size:
        return path
    print(f"writing {path} ({size // MiB} MiB, once)", file=sys.stderr)
    tmp = path.with_suffix(".tmp")
    rng = np.random.default_rng(0)
    with open(tmp, "wb") as fh:
        block = rng.integers(0, 256, 64 * MiB, dtype=np.uint8)
        for off in range(0, size, len(block)):
            block[:8] = np.frombuffer(off.to_bytes(8, "little"), np.uint8)  # distinct blocks
            fh.write(block[: min(len(block), size - off)].tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def raw_read(path: Path, size: int, threads: int, block: int, offset: int = 0) -> float:
    """GB/s of O_DIRECT preadv over ``size`` bytes of the file from ``offset`` (a multiple of ``block``),
    ``threads`` readers taking blocks in turn."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        def reader(k: int) -> None:
            buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
            for off in range(offset + k * block, offset + size, threads * block):
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    raise OSError(f"short read at {off}")
            buf.close()

        t0 = time.perf_counter()
        pool = [threading.Thread(target=reader, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return size / (time.perf_counter() - t0) / GB
    finally:
        os.close(fd)


def tensor_index(path: Path, size: int, seed: int) -> dict[str, WeightLocation]:
    """Back-to-back tensors of 1–50 MiB (odd byte counts, so most start unaligned) covering the file."""
    rng = np.random.default_rng(seed)
    index, off = {}, 0
    while off < size:
        n = min(int(rng.integers(1 * MiB, 50 * MiB)) | 1, size - off)
        index[f"bench#t{len(index)}"] = WeightLocation(str(path), off, n, DType.U8, (n,))
        off += n
    return index


def store_read(index: dict[str, WeightLocation], staging: int, inflight: int, threads: int,
               chunk: int) -> tuple[float, dict[str, object]]:
    total = sum(loc.nbytes for loc in index.values())
    with StreamingStore(index, staging, max_inflight=inflight, io_threads=threads, chunk_bytes=chunk,
                        direct=True) as store:
        t0 = time.perf_counter()
        store.prefetch(index)
        for ref in index:
            view = store.acquire(ref)
            view[:: 1 << 16].sum()  # touch the data, as compute would
            store.release(ref)
        gbps = total / (time.perf_counter() - t0) / GB
        if store.io_mode(next(iter(index.values())).path) != "direct":
            print("warning: the file system refused O_DIRECT; the store read buffered", file=sys.stderr)
        return gbps, store.stats()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--staging-mib", type=int, default=256)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--chunk-mib", type=int, default=2)
    args = ap.parse_args()
    size = args.size_mib * MiB
    path = bench_file(size)
    index = tensor_index(path, size, seed=1)
    print(f"file {path}: {size / GB:.2f} GB, {len(index)} tensors of 1-50 MiB; "
          f"store: staging {args.staging_mib} MiB, {args.inflight} reads ahead, {args.threads} I/O threads, "
          f"{args.chunk_mib} MiB chunks")
    raw, raw_qd, store, ratios = [], [], [], []
    stats: dict[str, object] = {}
    for i in range(args.repeat):
        # Alternate the order (ABBA) so that drifts of the (shared, virtual) disk hit both sides alike.
        order = ["raw", "qd", "store"] if i % 2 == 0 else ["store", "qd", "raw"]
        got: dict[str, float] = {}
        for kind in order:
            if kind == "raw":
                got[kind] = raw_read(path, size, 1, 8 * MiB)
            elif kind == "qd":
                got[kind] = raw_read(path, size, 4, 2 * MiB)
            else:
                got[kind], stats = store_read(index, args.staging_mib * MiB, args.inflight, args.threads,
                                              args.chunk_mib * MiB)
        raw.append(got["raw"])
        raw_qd.append(got["qd"])
        store.append(got["store"])
        ratios.append(got["store"] / got["raw"])
    med_raw, med_qd, med_store = median(raw), median(raw_qd), median(store)

    def runs(xs: list[float]) -> str:
        return " ".join(f"{x:.2f}" for x in xs)

    print(f"raw O_DIRECT sequential (1 thread, 8 MiB) : {med_raw:6.2f} GB/s median   runs {runs(raw)}")
    print(f"raw O_DIRECT (4 threads, 2 MiB blocks)    : {med_qd:6.2f} GB/s median   runs {runs(raw_qd)}")
    print(f"StreamingStore (prefetch, acquire/release): {med_store:6.2f} GB/s median   runs {runs(store)}")
    print(f"ratio store / raw sequential: {median(ratios):.2f}x median of paired runs ({runs(ratios)}); "
          f"store / raw 4 threads: {med_store / med_qd:.2f}x   (target >= 0.85x)")
    print(f"store telemetry (last run): read_gbps {stats['read_gbps']:.2f} while busy, "
          f"stall {stats['stall_s']:.3f} s, bytes_direct {stats['bytes_direct']}, "
          f"bytes_buffered {stats['bytes_buffered']}")
    return 0 if median(ratios) >= 0.85 else 1


if __name__ == "__main__":
    raise SystemExit(main())
