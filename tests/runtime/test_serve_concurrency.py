"""8 streaming clients at once on one `uaii serve` (continuous batching): each greedy reply equals the reply the
same request gets alone, or parts from it only at a near-tie of the solo run (top-1/top-2 logprob gap < 0.5).
Replies are compared token by token by the tokens' bytes (chat logprobs), not by their text: two tokens whose texts
decode alike (pieces of one character) are still told apart.

Batched rows compute what a single row computes (uaii-backends promises bit-identical rows), so the expected case
is "identical"; the test prints which case it saw for every client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import serving  # noqa: E402

from uaii.runtime.serve import ServerState  # noqa: E402

CLIENTS = 8
TOKENS = 12
NEAR_TIE = 0.5
PROMPTS = ["The capital of France is", "One, two, three,", "def fibonacci(n):", "My favourite fruit is",
           "The quick brown fox", "In 1492, Columbus", "Water boils at", "The first rule of"]


@pytest.fixture(scope="module")
def served(smollm2_path: Path) -> Iterator[tuple[str, ServerState]]:
    state = ServerState(smollm2_path, session_options={"max_context": 128})
    with serving(state) as url:
        yield url, state


def _body(prompt: str, stream: bool) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2, "stream": stream}


def solo(url: str, prompt: str) -> tuple[list[bytes], list[list[float]]]:
    """Tokens (their bytes) and per-position top-2 logprobs of the request run alone."""
    r = httpx.post(f"{url}/v1/chat/completions", json=_body(prompt, False), timeout=120)
    r.raise_for_status()
    items = r.json()["choices"][0]["logprobs"]["content"]
    return [bytes(i["bytes"]) for i in items], [[t["logprob"] for t in i["top_logprobs"]] for i in items]


def streamed(url: str, prompt: str, start: threading.Barrier, out: dict[str, Any]) -> None:
    tokens: list[bytes] = []
    try:
        start.wait(timeout=60)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=_body(prompt, True), timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    if choice["logprobs"]:
                        tokens += [bytes(i["bytes"]) for i in choice["logprobs"]["content"]]
        out[prompt] = tokens
    except Exception as exc:  # reported by the main thread
        out[prompt] = exc


def compare(alone: list[bytes], together: list[bytes], tops: list[list[float]]) -> str:
    """'identical', or 'near-tie at token i (gap g)'; fails when they part where the solo run was not near a tie."""
    if together == alone:
        return "identical"
    i = next((k for k, (a, b) in enumerate(zip(alone, together, strict=False)) if a != b),
             min(len(alone), len(together)))
    assert i < len(tops), f"replies differ in length only: {len(alone)} alone vs {len(together)} together"
    best = sorted(tops[i], reverse=True)
    gap = best[0] - best[1] if len(best) > 1 else float("inf")
    assert gap < NEAR_TIE, (f"the concurrent reply parts from the solo one at token {i} ({alone[i]!r} alone, "
                            f"{together[i]!r} together) where the solo top-1/top-2 gap is {gap:.3f} >= {NEAR_TIE}")
    return f"near-tie at token {i} (gap {gap:.3f})"


def test_eight_concurrent_streams_match_solo_runs(served: tuple[str, ServerState]) -> None:
    url, state = served
    alone = {p: solo(url, p) for p in PROMPTS[:CLIENTS]}
    out: dict[str, Any] = {}
    start = threading.Barrier(CLIENTS)
    threads = [threading.Thread(target=streamed, args=(url, p, start, out)) for p in PROMPTS[:CLIENTS]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    cases = {}
    for prompt in PROMPTS[:CLIENTS]:
        got = out.get(prompt)
        assert isinstance(got, list), f"client {prompt!r} failed: {got!r}"
        assert len(got) == TOKENS
        cases[prompt] = compare(alone[prompt][0], got, alone[prompt][1])
    print("\n".join(f"{p!r}: {c}" for p, c in cases.items()))
    assert state.loaded is not None
    hist = state.loaded.engine.stats()["batch_size_histogram"]
    assert max(hist) > 1, f"the concurrent requests were never decoded together: {hist}"
