"""One llama.cpp measurement through llama-cpp-python, in the benchmark-only environment (bench/llama_cpp_env.py):
load the GGUF, prefill the given token ids, decode greedily, print one JSON object. It imports nothing of uaii, so
it runs in that environment's interpreter.

    .venv-llama-cpp/bin/python bench/llama_cpp_worker.py MODEL.gguf IDS.json --gen-tokens 128 --threads 2
    .venv-llama-cpp/bin/python bench/llama_cpp_worker.py MODEL.gguf --smoke      # load + 8 tokens: does it run?

KV cache f16 (llama.cpp's default, and what uaii is run with), mmap on, context = prompt + generated tokens.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any


def read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (its mmap's page-cache misses included); None off Linux."""
    try:
        with open("/proc/self/io") as fh:
            return int(dict(line.split(": ") for line in fh.read().splitlines())["read_bytes"])
    except (OSError, KeyError, ValueError):
        return None


def measure(model: Path, ids: list[int], gen_tokens: int, threads: int, repack: bool = True) -> dict[str, Any]:
    import llama_cpp
    import llama_cpp.llama_cpp as low

    if not repack:  # llama.cpp's --no-repack: the Llama class does not expose use_extra_bufts; its defaults do
        defaults = low.llama_model_default_params

        def no_extra_bufts() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        low.llama_model_default_params = no_extra_bufts
    read0 = read_bytes()
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(model), n_threads=threads, n_threads_batch=threads,
                          n_batch=min(len(ids), 2048), n_ubatch=min(len(ids), 512), n_ctx=len(ids) + gen_tokens + 16,
                          verbose=False)
    load_s = time.perf_counter() - t0
    llm.eval(ids[:8])  # warm-up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    read_dec = read_bytes()
    t0 = time.perf_counter()
    for _ in range(gen_tokens):  # greedy, EOS ignored: every step is one decode
        token = llm.sample(temp=0.0)
        llm.eval([token])
    decode_s = time.perf_counter() - t0
    read1 = read_bytes()
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": gen_tokens / decode_s,
            "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "io_read_bytes": read1 - read0 if read0 is not None and read1 is not None else None,
            "decode_io_read_bytes": read1 - read_dec if read_dec is not None and read1 is not None else None,
            "version": llama_cpp.__version__, "repack": repack}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("model", type=Path)
    ap.add_argument("ids", type=Path, nargs="?", help="a JSON list of prompt token ids")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="8 prompt tokens and 2 generated: the build runs here")
    ap.add_argument("--no-repack", action="store_true",
                    help="keep the weights in the mapped file (llama.cpp's --no-repack): its default copies them "
                         "into repacked buffers of anonymous memory")
    args = ap.parse_args()
    if args.smoke:
        ids, gen = list(range(1, 9)), 2
    elif args.ids is None:
        ap.error("IDS is required unless --smoke")
    else:
        ids, gen = json.loads(args.ids.read_text()), args.gen_tokens
    print(json.dumps(measure(args.model, ids, gen, args.threads, repack=not args.no_repack)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
