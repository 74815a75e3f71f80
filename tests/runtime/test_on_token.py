"""Session.generate's per-token hook: every sampled token reaches it in order, and it can stop generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from uaii.runtime import Session
from uaii.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def session(smollm2_path: Path):
    with Session(smollm2_path, max_context=256) as s:
        yield s


def test_hook_sees_every_token_and_the_text(session: Session) -> None:
    seen: list[tuple[int, str]] = []
    r = session.generate("The capital of France is", max_new_tokens=12, ignore_eos=True,
                         on_token=lambda t, p: seen.append((t, p)))
    assert [t for t, _ in seen] == r.tokens and len(r.tokens) == 12
    pieces = "".join(p for _, p in seen)
    assert r.text.startswith(pieces) and len(r.text) - len(pieces) < 8  # only a held-back tail may remain


def test_hook_stops_generation_and_leaves_sampling_unchanged(session: Session) -> None:
    params = SamplingParams(temperature=0.8, top_k=40, seed=7)
    # Each run starts from an empty cache, so that the three draws are independent of prompt reuse.
    session.reset()
    plain = session.generate("Once upon a time", max_new_tokens=10, sampling=params, ignore_eos=True)
    hooked: list[int] = []
    session.reset()
    r = session.generate("Once upon a time", max_new_tokens=10, sampling=params, ignore_eos=True,
                         on_token=lambda t, p: hooked.append(t))
    assert r.tokens == plain.tokens == hooked  # same seed, same draws, with or without the hook
    session.reset()
    r = session.generate("Once upon a time", max_new_tokens=10, sampling=params, ignore_eos=True,
                         on_token=lambda t, p: t == plain.tokens[2])
    assert r.tokens == plain.tokens[:3] and r.finish_reason == "stop"
