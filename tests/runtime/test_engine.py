"""The continuous-batching engine on the real SmolLM2: concurrent requests give the tokens they give alone (and the
tokens of Session.generate), requests join and leave between steps, cancel and vanished consumers free their
sequence, stop strings / stop ids / max_tokens end a request as Session.generate does, a request that cannot fit is
refused before it is queued, seeded sampling repeats, logprobs are a distribution, and a failure ends only the
requests it concerns. Every request generates at most 24 tokens (the 2-core CI box).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.runtime import Engine, EngineError, GenRequest, Session, SessionError
from uaii.runtime.sampling import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fib(n):", "The best way to learn",
           "Water boils at", "My favourite colour is", "In 1492, Columbus"]
N = 16  # new tokens per request


@pytest.fixture(scope="module")
def session(smollm2_path: Path) -> Iterator[Session]:
    with Session(smollm2_path, max_context=256) as s:
        yield s


@pytest.fixture
def engine(session: Session) -> Iterator[Engine]:
    eng = Engine(session, max_sequences=8)
    yield eng
    eng.close()
    assert session.open_sequences == 0  # nothing leaks, whatever the test did


@pytest.fixture(scope="module")
def solo(session: Session) -> dict[str, list[int]]:
    """Each prompt's greedy ids from Session.generate (the reference the engine must reproduce)."""
    return {p: session.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in PROMPTS}


def _req(session: Session, prompt: str, n: int = N, **kw: Any) -> GenRequest:
    return GenRequest(prompt_ids=session.tokenize(prompt), max_tokens=n, ignore_eos=True, **kw)


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _admitted(h: Any) -> Any:
    """The sequence of ``h`` once the engine admitted it."""
    _wait(lambda: h.sequence is not None)
    return h.sequence


def test_concurrent_greedy_requests_equal_their_solo_runs(session: Session, engine: Engine,
                                                          solo: dict[str, list[int]]) -> None:
    """Eight different prompts at once: each request's ids equal the same request alone through the engine and
    Session.generate's greedy ids, bit for bit (batched rows are computed as if alone); the steps were batched."""
    alone = {p: engine.submit(_req(session, p)).result(timeout=60).token_ids for p in PROMPTS[:2]}
    handles = [engine.submit(_req(session, p)) for p in PROMPTS]
    results = [h.result(timeout=120) for h in handles]
    for p, r in zip(PROMPTS, results, strict=True):
        assert r.finish_reason == "length" and r.usage.completion_tokens == N
        assert r.token_ids == solo[p], p
        assert r.text == session.detokenize(solo[p])
    assert {p: solo[p] for p in alone} == alone
    hist = engine.stats()["batch_size_histogram"]
    if session.batched_decode:
        assert max(hist) > 1, hist


def test_requests_join_and_leave_between_steps(session: Session, engine: Engine,
                                               solo: dict[str, list[int]]) -> None:
    first = [engine.submit(_req(session, p, 24 if i == 0 else 6)) for i, p in enumerate(PROMPTS[:2])]
    events = first[0].events()
    got = [next(events) for _ in range(3)]  # the first request is decoding
    late = [engine.submit(_req(session, p)) for p in PROMPTS[2:4]]
    rest = [*got, *events]
    assert [e.token_id for e in rest[:-1]] == session.generate(PROMPTS[0], max_new_tokens=24, ignore_eos=True).tokens
    assert first[1].result(timeout=60).token_ids == solo[PROMPTS[1]][:6]
    for p, h in zip(PROMPTS[2:4], late, strict=True):
        assert h.result(timeout=60).token_ids == solo[p]
    assert len(engine.stats()["batch_size_histogram"]) > 1  # the batch grew and shrank


def test_a_long_prompt_does_not_stall_the_other_streams(session: Session, engine: Engine,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        solo: dict[str, list[int]]) -> None:
    """A prompt of several chunks is prefilled a chunk per iteration with a decode step of the others in between,
    and both requests still give their solo tokens."""
    monkeypatch.setattr(Session, "prefill_chunk", property(lambda self: 16))
    calls: list[str] = []
    prefill, decode = session.prefill, session.decode
    monkeypatch.setattr(session, "prefill", lambda seq, ids: (calls.append(f"p{len(ids)}"), prefill(seq, ids))[1])
    monkeypatch.setattr(session, "decode", lambda seqs, toks: (calls.append(f"d{len(seqs)}"), decode(seqs, toks))[1])
    first = engine.submit(_req(session, PROMPTS[0], 24))
    events = first.events()
    next(events)  # decoding (the iterator is kept: dropping it would cancel the request)
    long_ids = session.tokenize(" ".join(PROMPTS) * 2)[:100]
    long = engine.submit(GenRequest(prompt_ids=long_ids, max_tokens=4, ignore_eos=True))
    got = long.result(timeout=60).token_ids
    assert first.result(timeout=60).token_ids[:N] == solo[PROMPTS[0]]
    monkeypatch.undo()
    assert got == session.generate(long_ids, max_new_tokens=4, ignore_eos=True).tokens
    n = len(long_ids)
    assert n > 64
    chunks = [i for i, c in enumerate(calls) if c.startswith("p")][1:]  # the first one is the first request's
    assert [calls[i] for i in chunks] == ["p16"] * (n // 16) + ([f"p{n % 16}"] if n % 16 else [])
    assert all(calls[i + 1] == "d1" for i in chunks[:-1])  # the first request decoded between the chunks


def test_cancel_frees_the_sequence_and_ends_the_events(session: Session, engine: Engine) -> None:
    h = engine.submit(_req(session, PROMPTS[0], 24))
    other = engine.submit(_req(session, PROMPTS[1], 24))
    events = h.events()
    next(events)
    seq = h.sequence
    canceller = threading.Thread(target=h.cancel)  # from another thread than the consumer's
    canceller.start()
    canceller.join()
    assert list(events) == []  # no event after cancel
    _wait(lambda: seq.closed and engine.stats()["requests_active"] <= 1)
    assert seq.state is None
    r = h.result(timeout=1)
    assert r.finish_reason == "cancelled" and 1 <= len(r.token_ids) < 24
    assert other.result(timeout=60).usage.completion_tokens == 24  # the other request went on
    assert engine.stats()["requests_cancelled"] == 1


def test_a_vanished_consumer_does_not_leak_its_sequence(session: Session, engine: Engine) -> None:
    """Leaving the events loop early, or dropping the handle, cancels the request and releases its sequence."""
    h = engine.submit(_req(session, PROMPTS[0], 24))
    for _ in h.events():
        break
    seq = h.sequence
    assert h.result(timeout=5).finish_reason == "cancelled"
    _wait(lambda: seq.closed)
    h2 = engine.submit(_req(session, PROMPTS[1], 24))
    seq2 = _admitted(h2)
    del h2
    gc.collect()
    _wait(lambda: seq2.closed and engine.stats()["requests_active"] == 0)
    assert engine.stats()["requests_cancelled"] == 2  # not finished at max_tokens: cancelled when dropped


def test_stop_string_stop_id_and_max_tokens(session: Session, engine: Engine, solo: dict[str, list[int]]) -> None:
    p = PROMPTS[2]  # "1, 2, 3, 4," -> " 5, 6, 7, ..."
    full = session.detokenize(solo[p])
    stop = full[full.index("6"):full.index("6") + 2]
    h = engine.submit(_req(session, p, stop=(stop,)))
    pieces = [e.text for e in h.events()]
    r = h.result()
    assert r.finish_reason == "stop" and r.text == full[:full.index(stop)] == "".join(pieces)
    third = solo[p][2]
    r = engine.submit(_req(session, p, stop_token_ids=(third,))).result(timeout=60)
    assert (r.finish_reason, r.token_ids) == ("stop", solo[p][:solo[p].index(third)])
    r = engine.submit(_req(session, p, 3)).result(timeout=60)
    assert (r.finish_reason, r.token_ids, r.usage.completion_tokens) == ("length", solo[p][:3], 3)
    assert r.usage.prompt_tokens == len(session.tokenize(p)) and r.usage.total_tokens == r.usage.prompt_tokens + 3


def test_a_long_stop_string_does_not_delay_the_events(session: Session, engine: Engine,
                                                     solo: dict[str, list[int]]) -> None:
    """Only text that may begin a stop string waits: each token's event carries its own piece until then."""
    p = PROMPTS[0]  # " Paris.\n\nThe ..."
    h = engine.submit(_req(session, p, 4, stop=("\nObservation:",)))
    texts = [e.text for e in h.events()]
    assert texts[:2] == [session.detokenize(solo[p][:1]), "."] == [" Paris", "."]
    assert "".join(texts) == session.detokenize(solo[p][:4])


def test_eos_ends_a_request_unless_ignored(session: Session, engine: Engine) -> None:
    """A chat turn ends at the model's end-of-turn id (finish "stop", the id not emitted)."""
    ids = session.tokenizer.encode_chat([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    ref = session.generate(ids, max_new_tokens=24)
    r = engine.submit(GenRequest(prompt_ids=ids, max_tokens=24)).result(timeout=60)
    assert r.token_ids == ref.tokens
    assert r.finish_reason == ("stop" if ref.finish_reason == "eos" else ref.finish_reason)
    assert not set(r.token_ids) & engine.eos_ids


def test_a_request_that_cannot_fit_is_refused_before_queueing(session: Session, engine: Engine) -> None:
    ids = session.tokenize(PROMPTS[0])
    with pytest.raises(EngineError, match=rf"\[serve\] this model's context is 256 tokens; the request asks for "
                                          rf"{len(ids) + 252} \({len(ids)} in the prompt, max_tokens 252\)"):
        engine.submit(GenRequest(prompt_ids=ids, max_tokens=252))
    with pytest.raises(EngineError, match="context is 256"):
        engine.submit(GenRequest(prompt_ids=[1] * 300, max_tokens=1))
    with pytest.raises(EngineError, match="max_tokens must be an int >= 1, found 0"):
        engine.submit(GenRequest(prompt_ids=ids, max_tokens=0))
    with pytest.raises(EngineError, match=r"prompt token ids must be in \[0, 49152\)"):
        engine.submit(GenRequest(prompt_ids=[49152], max_tokens=1))
    st = engine.stats()
    assert (st["requests_total"], st["requests_queued"]) == (0, 0)
    r = engine.submit(GenRequest(prompt_ids=ids, max_tokens=256 - len(ids), ignore_eos=True))  # exactly fits
    r.cancel()


def test_seeded_sampling_is_reproducible(session: Session, engine: Engine) -> None:
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=1234)
    hs = [engine.submit(_req(session, p, sampling=params)) for p in (PROMPTS[1], PROMPTS[1], PROMPTS[4])]
    a, b, _ = (h.result(timeout=60).token_ids for h in hs)
    assert a == b == session.generate(PROMPTS[1], max_new_tokens=N, sampling=params, ignore_eos=True).tokens
    other = engine.submit(_req(session, PROMPTS[1], sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=99)))
    assert other.result(timeout=60).token_ids != a


def test_logprobs_of_greedy_tokens(session: Session, engine: Engine) -> None:
    h = engine.submit(_req(session, PROMPTS[0], 8, logprobs=5))
    events = [e for e in h.events() if e.token_id is not None]
    assert len(events) == 8
    for e in events:
        assert e.top_logprobs is not None and len(e.top_logprobs) == 5 and e.logprob is not None
        ids, pieces, lps = zip(*e.top_logprobs, strict=True)
        assert ids[0] == e.token_id and lps[0] == e.logprob == max(lps)  # greedy: the chosen one is the max
        assert list(lps) == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps)
        assert sum(np.exp(lps)) <= 1 + 1e-9
        assert pieces[0] == session.tokenizer.decode([e.token_id], skip_special=False)
    zero = engine.submit(_req(session, PROMPTS[0], 2, logprobs=0))
    assert all(e.top_logprobs == [] for e in zero.events() if e.token_id is not None)


def test_a_failing_sequence_ends_alone(session: Session, engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                       solo: dict[str, list[int]]) -> None:
    """A SessionError in a decode step that concerns one sequence ends that request (finish "error" and the
    message); the others in the same steps finish with their own tokens."""
    poisoned: list[Any] = []
    decode = session.decode

    def failing(seqs: list[Any], tokens: list[int]) -> Any:
        if any(s in poisoned for s in seqs) and any(s.length > 8 for s in seqs if s in poisoned):
            raise SessionError("[runtime] injected failure")
        return decode(seqs, tokens)

    monkeypatch.setattr(session, "decode", failing)
    bad = engine.submit(_req(session, PROMPTS[0]))
    poisoned.append(_admitted(bad))
    good = [engine.submit(_req(session, p)) for p in PROMPTS[1:3]]
    last = list(bad.events())[-1]
    assert (last.finish_reason, last.error) == ("error", "[runtime] injected failure")
    for p, h in zip(PROMPTS[1:3], good, strict=True):
        assert h.result(timeout=60).token_ids == solo[p]
    assert engine.stats()["requests_failed"] == 1


def test_a_bug_in_a_step_fails_the_active_requests_and_the_worker_goes_on(session: Session, engine: Engine,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    decode = session.decode
    calls = {"n": 0}

    def buggy(seqs: list[Any], tokens: list[int]) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ZeroDivisionError("a bug")
        return decode(seqs, tokens)

    monkeypatch.setattr(session, "decode", buggy)
    r = engine.submit(_req(session, PROMPTS[0], 8)).result(timeout=60)
    assert r.finish_reason == "error" and "ZeroDivisionError: a bug" in (r.error or "")
    assert engine.submit(_req(session, PROMPTS[0], 4)).result(timeout=60).finish_reason == "length"


def test_aevents_does_not_block_the_event_loop(session: Session, engine: Engine,
                                               solo: dict[str, list[int]]) -> None:
    async def main() -> tuple[list[int], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        h = engine.submit(_req(session, PROMPTS[3]))
        ids = [e.token_id async for e in h.aevents() if e.token_id is not None]
        done.set()
        await task
        return ids, ticks

    ids, ticks = asyncio.run(main())
    assert ids == solo[PROMPTS[3]]
    assert ticks > N  # the loop ran between the events


def test_a_decode_step_wakes_each_event_loop_once(session: Session, engine: Engine,
                                                  solo: dict[str, list[int]]) -> None:
    """4 streams consumed on one event loop: the worker wakes that loop once per step for all 4 tokens (each
    wake-up is a write to the loop's wake-up fd and a turn of the loop, on the cores that decode), not once per
    token; the tokens are still every stream's own."""
    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        calls = 0
        plain = loop.call_soon_threadsafe

        def counting(*args: Any, **kw: Any) -> Any:
            nonlocal calls
            calls += 1
            return plain(*args, **kw)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        handles = [engine.submit(_req(session, p)) for p in PROMPTS[:4]]

        async def consume(h: Any) -> list[int]:
            return [e.token_id async for e in h.aevents() if e.token_id is not None]

        ids = await asyncio.gather(*(consume(h) for h in handles))
        return list(ids), calls

    steps_before = engine.stats()["decode_steps"]
    ids, calls = asyncio.run(main())
    assert ids == [solo[p] for p in PROMPTS[:4]]
    steps = engine.stats()["decode_steps"] - steps_before
    # per step one call for all rows; the first tokens come from prefill iterations (one call each), and the
    # requests' last events from the steps that end them: fewer calls than tokens by far
    assert steps >= N - 1 and calls <= steps + 4 + 4, (calls, steps)


def test_close_cancels_everything_and_refuses_more(session: Session) -> None:
    eng = Engine(session, max_sequences=2)
    hs = [eng.submit(_req(session, p, 200)) for p in PROMPTS[:4]]  # two active, two queued
    _wait(lambda: eng.stats()["requests_active"] == 2)
    eng.close()
    assert [h.result(timeout=1).finish_reason for h in hs] == ["cancelled"] * 4
    assert session.open_sequences == 0
    with pytest.raises(EngineError, match="closed"):
        eng.submit(_req(session, PROMPTS[0]))
