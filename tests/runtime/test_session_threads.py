"""One Session used from several threads: calls are serialized, reentrant use raises SessionError, and close()
during a generation is safe. Each scenario runs in a subprocess (a segfault fails the test instead of killing
pytest), several rounds, and compares what the threads got with the serial results.

Regression (issue 11, point 4): two threads generating on one Session interleaved their forward passes over one
arena and one KV cache (wrong tokens, then a segfault), and close() from another thread during generate unmapped
the weights under a running kernel (SIGSEGV).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import chat_gguf
import loader_helpers as H
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROUNDS = 3
VOCAB = 512

SCENARIOS = r'''
import sys, threading, time
from uaii.runtime import Session, SessionError

path, scenario, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
PROMPTS = ["hello there, how are you", "once upon a time in a far land", "the quick brown fox jumps"]
GEN = {"max_new_tokens": 40, "ignore_eos": True}


def serial():
    with Session(path) as s:
        return [s.generate(p, **GEN).tokens for p in PROMPTS]


def run_threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread never finished (deadlock?)"


def concurrent(want):
    """Three threads generate on one session at once: each gets what a serial run gives."""
    with Session(path) as s:
        got, errors = {}, []

        def work(i):
            try:
                for _ in range(2):
                    got.setdefault(i, []).append(s.generate(PROMPTS[i], **GEN).tokens)
            except BaseException as exc:
                errors.append(repr(exc))

        run_threads([lambda i=i: work(i) for i in range(3)])
        assert not errors, errors
        assert all(t == want[i] for i, ts in got.items() for t in ts), "a thread got other tokens than serially"


def close_during_generate(want):
    """close() from another thread while a generation runs: the generation ends with a SessionError (or had
    finished), the session is closed, and nothing crashes."""
    s = Session(path)
    started, outcome = threading.Event(), []

    def work():
        try:
            r = s.generate(PROMPTS[0], max_new_tokens=100000, ignore_eos=True,
                           on_token=lambda t, p: started.set())
            outcome.append(("done", r.finish_reason))
        except SessionError as exc:
            outcome.append(("closed", str(exc)))

    t = threading.Thread(target=work)
    t.start()
    assert started.wait(60)
    s.close()
    t.join(60)
    assert not t.is_alive()
    assert outcome and (outcome[0][0] == "closed" and "closed" in outcome[0][1] or outcome[0] == ("done", "length"))
    assert s.state.value == "closed"
    try:
        s.generate(PROMPTS[0], **GEN)
        raise AssertionError("a closed session generated")
    except SessionError as exc:
        assert "closed" in str(exc)


def close_while_stream_suspended(want):
    """A stream suspended at a piece in one thread; another thread closes: the stream raises SessionError when
    resumed."""
    s = Session(path)
    it = s.stream(PROMPTS[1], max_new_tokens=100000, ignore_eos=True)
    next(it)
    closer = threading.Thread(target=s.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() waited for a suspended stream"
    try:
        next(it)
        raise AssertionError("a stream went on after close()")
    except SessionError as exc:
        assert "closed" in str(exc)


def others_wait_for_a_stream(want):
    """While a stream of thread A is suspended, thread B's generate waits for it, then answers correctly."""
    with Session(path) as s:
        order, got = [], {}
        it = s.stream(PROMPTS[0], **GEN)
        first = next(it)

        def other():
            got["b"] = s.generate(PROMPTS[2], **GEN).tokens
            order.append("b")

        b = threading.Thread(target=other)
        b.start()
        time.sleep(0.3)
        rest = "".join(it)
        order.append("a")
        b.join(60)
        assert order == ["a", "b"], order
        assert s.last_result is not None and got["b"] == want[2]
        assert first + rest


def reentrant_calls_raise(want):
    """Calls from the thread that holds the session raise SessionError instead of deadlocking or corrupting it."""
    with Session(path) as s:
        seen = []

        def on_token(t, piece):
            try:
                s.generate(PROMPTS[2], max_new_tokens=2)
            except SessionError as exc:
                seen.append(str(exc))
            return len(seen) >= 3

        r = s.generate(PROMPTS[0], on_token=on_token, **GEN)
        assert len(seen) == 3 and all("already using the session" in m for m in seen), seen
        assert r.tokens == want[0][:3]
        it = s.stream(PROMPTS[1], **GEN)
        next(it)
        for call in (lambda: s.generate(PROMPTS[2], **GEN), lambda: s.forward([5]), s.reset,
                     lambda: next(s.stream(PROMPTS[2], **GEN))):
            try:
                call()
                raise AssertionError("a reentrant call ran")
            except SessionError as exc:
                assert "stream() that is not finished" in str(exc)
        it.close()
        assert s.generate(PROMPTS[2], **GEN).tokens == want[2]


def close_from_on_token(want):
    """close() from the generation's own callback: the generation stops at its next pass, then the session
    closes."""
    s = Session(path)
    try:
        s.generate(PROMPTS[0], on_token=lambda t, p: s.close(), **GEN)
        raise AssertionError("generation went on after close()")
    except SessionError as exc:
        assert "being closed" in str(exc), exc
    assert s.state.value == "closed" and s.last_result is not None and len(s.last_result.tokens) == 1


want = serial()
for _ in range(rounds):
    globals()[scenario](want)
print("ok", scenario)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A llama large enough that a forward pass takes a while (~14 MiB of f32 weights), with a tokenizer."""
    import torch

    cfg = {**H.TINY["llama"][2], "vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 768,
           "num_hidden_layers": 4, "max_position_embeddings": 1024}
    torch.manual_seed(H.RNG_SEED)
    root = tmp_path_factory.mktemp("threads")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval().save_pretrained(root / "hf")
    path = root / "mid.gguf"
    H.hf_to_gguf(root / "hf", path, "llama", extra_kv=chat_gguf.tokenizer_kv(VOCAB))
    return path


@pytest.mark.parametrize("scenario", ["concurrent", "close_during_generate", "close_while_stream_suspended",
                                      "others_wait_for_a_stream", "reentrant_calls_raise", "close_from_on_token"])
def test_threads(model: Path, scenario: str) -> None:
    proc = subprocess.run([sys.executable, "-c", SCENARIOS, str(model), scenario, str(ROUNDS)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode} (-11: segfault)\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip().endswith(f"ok {scenario}")


def test_the_guard_serves_waiters_in_arrival_order() -> None:
    """A thread that holds the guard in a loop (the serving engine: one decode step per hold) lets a waiter in at
    its next release, instead of taking the guard back before the woken waiter runs (an embedding request waited
    for a whole chat stream so); a waiter interrupted while waiting does not block the ones behind it."""
    from uaii.runtime.guard import SessionGuard

    guard = SessionGuard(lambda: None)
    stop = threading.Event()
    steps = [0]

    def engine() -> None:
        while not stop.is_set():
            with guard.hold("decode"):
                steps[0] += 1
                time.sleep(0.002)

    waits: list[int] = []

    def embed() -> None:
        for _ in range(5):
            before = steps[0]
            with guard.hold("embed"):
                waits.append(steps[0] - before)

    t = threading.Thread(target=engine)
    t.start()
    try:
        time.sleep(0.02)
        w = threading.Thread(target=embed)
        w.start()
        w.join(10)
        starved = w.is_alive()
    finally:
        stop.set()  # lets a starved waiter in, so that the test fails instead of hanging
        t.join()
    w.join()
    assert not starved, f"the waiter got the guard {len(waits)} times in 10 s while a loop held it step by step"
    assert max(waits) <= 2, waits
    # an abandoned ticket (its waiter interrupted) is skipped
    with guard.hold("first"), guard.cv:  # a waiter that took the next ticket and was interrupted (hold's except)
        ticket = guard._tickets
        guard._tickets += 1
        guard._abandoned.add(ticket)
        guard._skip_abandoned()
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (guard.hold("after").__enter__(), done.set()), daemon=True)
    waiter.start()
    assert done.wait(5), "a ticket behind an abandoned one was never served"
