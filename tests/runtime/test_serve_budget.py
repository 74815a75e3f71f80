"""The memory budget of a server (SmolLM2, streaming under 64 MiB): the sequences' KV states and the batched decode
executable count against it. The budget keeps room for ``sequences`` KV states (halved while the plan does not fit),
the engine admits a request only when one more state fits (the others wait; never over the budget), and a batched
executable that does not fit is not kept: decode runs one pass per sequence, warned, and /metrics says so. Without
a budget decode batches."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from uaii.runtime import Session
from uaii.runtime.engine import Engine, GenRequest
from uaii.runtime.presets import MiB

BUDGET = 64 * MiB  # SmolLM2's weights are 92 MiB: some layers stream
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "Water boils at"]
N = 12


@pytest.fixture(scope="module")
def tight(smollm2_path: Path) -> Iterator[Session]:
    """Room for 8 sequence states asked; 64 MiB keeps room for 2 of SmolLM2's 11.8 MB ones (max_context 256)."""
    with Session(smollm2_path, budget_bytes=BUDGET, max_context=256, plan_cache=False, sequences=8) as s:
        yield s


def _req(s: Session, prompt: str) -> GenRequest:
    return GenRequest(prompt_ids=s.tokenize(prompt), max_tokens=N, ignore_eos=True)


def test_the_budget_keeps_room_for_sequences(tight: Session, caplog: pytest.LogCaptureFixture) -> None:
    assert tight.streaming and tight.sequence_bytes == 256 * 46080
    seqs = []
    while tight.sequence_fits():
        seqs.append(tight.new_sequence())
        assert len(seqs) <= 8
    assert len(seqs) == 2  # what the plan kept room for
    assert tight.memory_bytes() <= BUDGET < tight.memory_bytes() + tight.sequence_bytes
    for s in seqs:
        tight.release(s)
    assert tight.sequence_fits()


def test_tight_budget_decodes_one_sequence_per_pass(tight: Session, caplog: pytest.LogCaptureFixture) -> None:
    """Two sequences fill the budget: the batched executable (its arena, its row buffers) does not fit, so it is
    not kept (warned once) and decode runs per sequence — with the results of solo runs."""
    engine = Engine(tight, max_sequences=8)
    try:
        alone = {p: engine.submit(_req(tight, p)).result(timeout=120).token_ids for p in PROMPTS}
        with caplog.at_level(logging.WARNING, logger="uaii.runtime"):
            handles = [engine.submit(_req(tight, p)) for p in PROMPTS]
            got = {p: h.result(timeout=300).token_ids for p, h in zip(PROMPTS, handles, strict=True)}
        stats = engine.stats()
    finally:
        engine.close()
    assert got == alone
    assert tight._batch_exe is None and not tight.batched_decode and stats["batched_decode"] is False
    warned = [r.message for r in caplog.records if "batched decode needs" in r.message]
    assert len(warned) == 1 and "decoding one sequence per pass" in warned[0]
    # never more than the budget holds: at most 2 sequences per decode step, all requests served
    assert max(stats["batch_size_histogram"]) == 2 and stats["requests_failed"] == 0
    assert tight.open_sequences == 0


def test_engine_never_admits_over_the_budget(tight: Session) -> None:
    seen: list[int] = []
    engine = Engine(tight, max_sequences=8)
    original = tight.new_sequence

    def watched() -> object:
        seq = original()
        seen.append(tight.open_sequences)
        assert tight.memory_bytes() <= BUDGET
        return seq

    tight.new_sequence = watched  # type: ignore[method-assign]
    try:
        results = [h.result(timeout=300) for h in [engine.submit(_req(tight, p)) for p in PROMPTS * 2]]
    finally:
        engine.close()
        del tight.new_sequence
    assert all(r.finish_reason == "length" and len(r.token_ids) == N for r in results)
    assert len(seen) == 8 and max(seen) == 2  # the others waited for memory to free


def test_a_sequence_that_cannot_fit_fails_its_request(smollm2_path: Path) -> None:
    with Session(smollm2_path, budget_bytes=32 * MiB, max_context=256, plan_cache=False) as s, \
            Engine(s) as engine:
        assert not s.sequence_fits()
        r = engine.submit(_req(s, PROMPTS[0])).result(timeout=60)
    assert r.finish_reason == "error" and "cannot hold one more sequence's KV state (11796480 bytes)" in str(r.error)


def test_without_a_budget_decode_batches(smollm2_path: Path) -> None:
    with Session(smollm2_path, max_context=256, plan_cache=False) as s:
        a, b = s.new_sequence(), s.new_sequence()
        s.prefill(a, s.tokenize(PROMPTS[0]))
        s.prefill(b, s.tokenize(PROMPTS[1]))
        s.decode([a, b], [5, 6])
        assert s.batched_decode and s._batch_exe is not None and s.sequence_fits()


def test_without_a_budget_nothing_is_reserved_and_nothing_warned(smollm2_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a server (sequences=8) without a budget logged "a memory budget of 0 bytes keeps room for 0
    sequence KV state(s)" at every load."""
    with caplog.at_level("WARNING", logger="uaii.runtime"), \
            Session(smollm2_path, max_context=256, plan_cache=False, sequences=8) as s:
        assert s.sequence_fits()
    assert not [r for r in caplog.records if "keeps room for" in r.getMessage()]


def test_metrics_say_whether_decode_batches(smollm2_path: Path) -> None:
    pytest.importorskip("starlette")
    from uaii.runtime.serve import ServerState
    from uaii.runtime.serve.metrics import render
    from uaii.runtime.serve.state import Limits

    state = ServerState(model=smollm2_path, limits=Limits(max_sequences=4),
                        session_options={"budget_bytes": BUDGET, "max_context": 256, "plan_cache": False})
    try:
        assert state.loaded is not None and state.loaded.engine is not None
        engine = state.loaded.engine
        for h in [engine.submit(_req(state.loaded.session, p)) for p in PROMPTS[:3]]:
            h.result(timeout=300)
        page = render(state)
    finally:
        state.close()
    assert "# TYPE uaii_batched_decode gauge" in page and "\nuaii_batched_decode 0.0\n" in page
