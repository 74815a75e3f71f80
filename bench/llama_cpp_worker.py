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


def measure(model: Path, ids: list[int], gen_tokens: int, threads: int) -> dict[str, Any]:
    import llama_cpp

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
    t0 = time.perf_counter()
    for _ in range(gen_tokens):  # greedy, EOS ignored: every step is one decode
        token = llm.sample(temp=0.0)
        llm.eval([token])
    decode_s = time.perf_counter() - t0
    return {"load_s": load_s, "prefill_tok_s": len(ids) / prefill_s, "decode_tok_s": gen_tokens / decode_s,
            "peak_rss_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "version": llama_cpp.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("model", type=Path)
    ap.add_argument("ids", type=Path, nargs="?", help="a JSON list of prompt token ids")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="8 prompt tokens and 2 generated: the build runs here")
    args = ap.parse_args()
    if args.smoke:
        ids, gen = list(range(1, 9)), 2
    elif args.ids is None:
        ap.error("IDS is required unless --smoke")
    else:
        ids, gen = json.loads(args.ids.read_text()), args.gen_tokens
    print(json.dumps(measure(args.model, ids, gen, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
