"""``uaii bench`` measures what it says on SmolLM2: the prefill figure times the whole prompt.

Regression: the warm-up generated from the prompt's first 16 tokens and the measured run reused them from the KV
cache, so "prefill (N tokens)" timed N - 16 tokens, and a prompt of 16 tokens or fewer printed 0 tok/s."""

from __future__ import annotations

from pathlib import Path

import pytest

from uaii.runtime import Session
from uaii.runtime.cli.bench import run_bench


@pytest.mark.parametrize("prompt_tokens", [12, 16, 40])
def test_the_prefill_figure_times_every_prompt_token(smollm2_path: Path, prompt_tokens: int) -> None:
    with Session(smollm2_path, n_threads=2, max_context=64) as s:
        res = run_bench(s, prompt_tokens=prompt_tokens, gen_tokens=3, warmup=1)
    assert res["prompt_tokens"] == prompt_tokens and res["new_tokens"] == 3
    assert res["prefill_s"] > 0 and res["prefill_tok_s"] > 0
    # the rate is prefilled tokens / prefill time: every prompt token was run, none served from the warm-up's cache
    assert res["prefill_tok_s"] * res["prefill_s"] == pytest.approx(prompt_tokens, rel=1e-6)
