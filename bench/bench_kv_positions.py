"""KV window positioning benchmark: perplexity of SmolLM2 on a long text with a resident window, absolute RoPE
positions (``kv_positions="absolute"``, the default) against StreamingLLM positions within the cache
(``kv_positions="cache"``), with and without attention sinks, as ratios to the unbounded cache.

The text is the Python reference documentation shipped with the interpreter (``pydoc_data.topics``: every topic,
sorted by name, joined), so it is available offline and the same on every run of one Python version. Tokens are
fed one at a time, each scored from the logits of the step before, so every token sees the cache state a
generation would have (a window that slid while the text was read). Runs:

* unbounded cache (the reference);
* for each window W: W + 4 sinks and W + 0 sinks, each with absolute and with cache positions.

The first W + sinks tokens are scored identically by every run (nothing has been dropped yet); the "past the
window" columns score only the later ones, where the runs differ.

    uv run --no-sync python bench/bench_kv_positions.py            # 4,000 tokens, W in {256, 1024}
    uv run --no-sync python bench/bench_kv_positions.py --quick    # 1,500 tokens, W = 256
    uv run --no-sync python bench/bench_kv_positions.py --tokens 2000 --windows 128 512 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_models import model_path

REPO = Path(__file__).resolve().parents[1]
SINKS = 4


def long_text() -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def text_ids(path: Path, n: int) -> list[int]:
    from uaii.tokenizers import load

    ids = list(load(path).encode(long_text(), add_special=True))
    if len(ids) < n:
        raise SystemExit(f"[bench] the text has {len(ids)} tokens, fewer than the {n} asked for")
    return [int(t) for t in ids[:n]]


def score(path: Path, ids: list[int], options: dict[str, Any]) -> dict[str, Any]:
    """Negative log-likelihood of every token after the first, one decode step per token."""
    from uaii.runtime import Session

    with Session(path, max_context=len(ids) + 8, **options) as s:
        nll = np.zeros(len(ids) - 1)
        t0 = time.perf_counter()
        logits = s.forward([ids[0]])
        for i in range(1, len(ids)):
            x = logits.astype(np.float64)
            top = x.max()
            nll[i - 1] = top + math.log(np.exp(x - top).sum()) - x[ids[i]]
            if i + 1 < len(ids):
                logits = s.forward([ids[i]])
        elapsed = time.perf_counter() - t0
        compactions = s._kv.compactions
    return {"options": options, "nll": nll, "tok_s": (len(ids) - 1) / elapsed, "compactions": compactions}


def ppl(nll: np.ndarray) -> float:
    return float(math.exp(nll.mean())) if nll.size else float("nan")


def runs_for(windows: list[int]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [("unbounded", {})]
    for w in windows:
        for sinks in (SINKS, 0):
            for mode in ("absolute", "cache"):
                out.append((f"W={w} + {sinks} sinks, {mode}",
                            {"kv_window": w, "kv_sinks": sinks, "kv_positions": mode}))
    return out


def table(rows: list[dict[str, Any]], ref: dict[str, Any]) -> None:
    print("| run | PPL | x unbounded | PPL past the window | x unbounded | compactions | tok/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        o = r["options"]
        # tokens scored once the window had slid: index i scores token i + 1, which sees i + 1 cached tokens
        skip = o.get("kv_window", 0) + o.get("kv_sinks", 0) if o else 0
        past, ref_past = r["nll"][skip:], ref["nll"][skip:]
        p_all, p_past = ppl(r["nll"]), ppl(past)
        ratio_past = p_past / ppl(ref_past) if o else float("nan")
        print(f"| {r['label']} | {p_all:.3f} | {p_all / ppl(ref['nll']):.3f} | "
              f"{'-' if not o else f'{p_past:.3f}'} | {'-' if not o else f'{ratio_past:.3f}'} | "
              f"{r['compactions']} | {r['tok_s']:.1f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,500 tokens and W = 256 only")
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--tokens", type=int, help="tokens of the text to score (default 4000, --quick 1500)")
    ap.add_argument("--windows", type=int, nargs="+", help="window sizes (default 256 1024, --quick 256)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write the figures here")
    args = ap.parse_args(argv)
    n = args.tokens or (1500 if args.quick else 4000)
    windows = args.windows or ([256] if args.quick else [256, 1024])
    path = model_path(args.model)
    ids = text_ids(path, n)
    print(f"{path.name}: {n} tokens of pydoc_data.topics (Python {sys.version.split()[0]}), one token per step",
          file=sys.stderr)
    rows = []
    for label, options in runs_for(windows):
        r = score(path, ids, options)
        r["label"] = label
        rows.append(r)
        print(f"  {label}: PPL {ppl(r['nll']):.3f}, {r['tok_s']:.1f} tok/s", file=sys.stderr)
    print(f"\nPerplexity of {path.name} over {n} tokens (the first is not scored):\n")
    table(rows, rows[0])
    if args.json:
        args.json.write_text(json.dumps({"model": path.name, "tokens": n, "python": sys.version.split()[0],
                                         "runs": [{"label": r["label"], "options": r["options"],
                                                   "ppl": ppl(r["nll"]), "tok_s": r["tok_s"],
                                                   "compactions": r["compactions"]} for r in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
