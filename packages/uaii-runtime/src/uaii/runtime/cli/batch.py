"""``uaii bench --batch N``: N sequences decoding together — aggregate and per-sequence decode tok/s, the ratio to
one sequence measured in the same run, and the file bytes read per generated token.

Why: under a memory budget every streamed weight is read once per forward pass, so a pass that decodes N
sequences (the batched decode a server runs: one GEMM over N rows) reads each streamed byte once for N tokens;
in memory, batching turns N GEMVs into one GEMM. Each sequence gets its own prompt of the benchmark's length
(the benchmark text from a different offset, so the rows differ: ``bench.batch_prompt_ids``) and decodes
greedily, every step one ``Session.decode`` of all N.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def run_batch(session: Any, prompts: list[list[int]], gen_tokens: int) -> dict[str, Any]:
    """Prefill one sequence per prompt, then ``gen_tokens`` greedy tokens of all of them together (the first token
    of each comes from its prefill's logits, as in generate: ``gen_tokens - 1`` decode passes are timed)."""
    n = len(prompts)
    seqs = [session.new_sequence() for _ in range(n)]
    try:
        logits = np.stack([session.prefill(s, p) for s, p in zip(seqs, prompts, strict=True)])
        tokens = [int(t) for t in np.argmax(logits, axis=-1)]
        read0 = _bytes_read(session)
        steps = max(gen_tokens - 1, 0)
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = session.decode(seqs, tokens)
            tokens = [int(t) for t in np.argmax(logits, axis=-1)]
        seconds = time.perf_counter() - t0
        read = _bytes_read(session) - read0
    finally:
        for s in seqs:
            session.release(s)
    per_seq = steps / seconds if steps and seconds > 0 else 0.0
    return {
        "batch": n,
        "batched_pass": bool(session.batched_decode),
        "batch_decode_steps": steps,
        "batch_decode_s": seconds,
        "batch_decode_tok_s": per_seq * n,
        "batch_per_sequence_tok_s": per_seq,
        "batch_bytes_read_per_token": read / (steps * n) if steps and session.streaming else None,
    }


def _bytes_read(session: Any) -> int:
    return int(session.storage_stats().get("bytes_read", 0) or 0) if session.streaming else 0


__all__ = ["run_batch"]
