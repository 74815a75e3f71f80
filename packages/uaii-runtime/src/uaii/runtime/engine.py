"""The continuous-batching engine: many generation requests on one Session, decoded together.

    engine = Engine(session, max_sequences=8)
    handle = engine.submit(GenRequest(prompt_ids=ids, max_tokens=32))
    for event in handle.events():          # or `async for event in handle.aevents()` in asyncio code
        print(event.text, end="")
    engine.close()

Why a worker thread: a Session runs one pass at a time and a pass is the expensive part, so one thread owns the
session and every request is a :class:`Sequence` of it. The worker loops:

1. drop what was cancelled (the sequence is released before the next pass);
2. admit queued requests while fewer than ``max_sequences`` are active (each gets a sequence);
3. prefill: up to one chunk of prompt tokens (``session.prefill_chunk``) over the requests still prefilling, so a
   long prompt runs a chunk per iteration and the streams of the others go on between its chunks; a request whose
   prompt is complete samples its first token;
4. one ``session.decode`` over every request that is decoding (one batched pass when the backend has
   ``batched_kv``): each row is sampled with its request's own sampler.

Requests join and leave between steps. A request ends on an end-of-sequence id (``eos_ids``, unless
``ignore_eos``), one of its ``stop_token_ids`` or ``stop`` strings (the text stops before it, as Session.generate
does), ``max_tokens`` (finish reason "length") or the context. Its events are one :class:`Event` per generated token
(``text``: the piece that is safe to show, as ``Session.stream`` gives them; empty while a character or a possible
stop string is incomplete) and a last event with ``token_id`` None, the text held back till then, the
``finish_reason`` and the :class:`Usage`.

Failures stay with their request: an error of a pass (a SessionError) ends the requests it concerns with
``finish_reason="error"`` and the message, and the others go on; an unexpected exception in the worker is logged and
fails the active requests, and the worker keeps accepting new ones. This module imports no web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from uaii.ir import UaiiError
from uaii.runtime.generate import TextStream, make_sampler
from uaii.runtime.sampling import SamplingParams

log = logging.getLogger("uaii.runtime.engine")
RECENT_S = 10.0  # decode tok/s in stats() is measured over the steps of the last this many seconds


class EngineError(UaiiError):
    """A request the engine cannot take (too long for the context, bad parameters) or an engine that is closed."""

    component = "serve"


@dataclass
class GenRequest:
    """One generation request: prompt token ids (the chat template already applied) and how to generate.

    ``logprobs``: None for none; k >= 0 for the chosen token's log-probability and the k most probable tokens',
    both from the model's distribution (log-softmax of the logits, before temperature or filters)."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    ignore_eos: bool = False


@dataclass
class Usage:
    """Tokens of a request (OpenAI's usage) and its timing: ``ttft_s`` from submit to the first token (queueing and
    prefill included), ``decode_tok_s`` its tokens per second after the first."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    ttft_s: float = 0.0
    decode_tok_s: float = 0.0


@dataclass
class Event:
    """One generated token (``token_id``, the ``text`` piece now safe to show, possibly empty) or, with
    ``token_id`` None, the end: the text held back until then, ``finish_reason`` ("stop", "length" or "error", then
    with ``error``, the message) and ``usage``. ``logprob``/``top_logprobs`` when the request asked for them."""

    token_id: int | None
    text: str
    logprob: float | None = None
    top_logprobs: list[tuple[int, str, float]] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None


@dataclass
class Result:
    """What a request produced: the whole text, the generated ids, why it ended ("cancelled" after
    :meth:`Handle.cancel`), its usage, and the error message when it failed."""

    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    error: str | None = None


_END = object()  # put on a cancelled job's queue: wakes a consumer that waits for its next event


class Job:
    """A request inside the engine: the consumer's side (event queue, cancel flag, result) and the worker's
    (sequence, sampler, text stream, progress). ``lock`` makes "no event after cancel" exact."""

    def __init__(self, req: GenRequest, wake: Callable[[], None],
                 defer: Callable[[Job], bool] | None = None) -> None:
        self.req = req
        self._wake = wake
        self._defer = defer  # the engine's: True when it wakes this job's waiters itself, after the step
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.cancelled = False
        self.done = threading.Event()
        self.result: Result | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.submitted = time.perf_counter()
        # the worker's
        self.seq: Any = None
        self.sampler: Any = None
        self.text: TextStream | None = None
        self.fed = 0  # prompt tokens prefilled
        self.pending: int | None = None  # the sampled token the next decode step feeds
        self.out: list[int] = []
        self.first_at: float | None = None  # when its first token was sampled
        self.last_at: float | None = None

    @property
    def prefilling(self) -> bool:
        return self.seq is not None and self.fed < len(self.req.prompt_ids)

    def emit(self, event: Event) -> None:
        with self.lock:
            if self.cancelled or self.done.is_set():
                return
            self.events.put(event)
        self._notify_soon()

    def finish(self, event: Event, result: Result) -> None:
        with self.lock:
            if self.cancelled or self.done.is_set():
                return
            self.result = result
            self.events.put(event)
            self.done.set()
        self._notify_soon()

    def cancel(self) -> None:
        with self.lock:
            if self.cancelled or self.done.is_set():
                return
            self.cancelled = True
            text = self.text.text if self.text is not None else ""
            n, p = len(self.out), len(self.req.prompt_ids)
            self.result = Result(text, list(self.out), "cancelled", Usage(p, n, p + n))
            self.events.put(_END)
            self.done.set()
        self._notify()
        self._wake()  # the worker releases the sequence before its next pass

    def add_waiter(self, loop: asyncio.AbstractEventLoop, flag: asyncio.Event) -> None:
        with self.lock:
            self._waiters.append((loop, flag))

    def remove_waiter(self, loop: asyncio.AbstractEventLoop, flag: asyncio.Event) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self._waiters.remove((loop, flag))

    def waiters(self) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]:
        with self.lock:
            return list(self._waiters)

    def _notify_soon(self) -> None:
        if self._defer is None or not self._defer(self):
            self._notify()

    def _notify(self) -> None:
        wake_waiters(self.waiters())


def wake_waiters(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]) -> None:
    """Set each asyncio waiter's flag in its own loop: one ``call_soon_threadsafe`` per loop, whatever the number
    of flags (each call writes the loop's wake-up fd and costs the loop a wake-up)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Event]] = {}
    for loop, flag in waiters:
        by_loop.setdefault(loop, []).append(flag)
    for loop, flags in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_set_flags, flags)


def _set_flags(flags: list[asyncio.Event]) -> None:
    for flag in flags:
        flag.set()


class Handle:
    """The caller's side of a submitted request. A handle dropped (garbage-collected) before its request ends, or
    an ``events()``/``aevents()`` iteration left before the end, cancels the request: a consumer that vanished
    never leaks a sequence."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._finalizer = weakref.finalize(self, job.cancel)

    @property
    def request(self) -> GenRequest:
        return self._job.req

    @property
    def sequence(self) -> Any:
        """The request's Sequence while it is admitted (None before; closed once the request ends)."""
        return self._job.seq

    @property
    def done(self) -> bool:
        return self._job.done.is_set()

    def cancel(self) -> None:
        """Stop the request (any thread): no event comes after this returns; the worker releases its sequence
        before its next pass. A request that has ended is not affected."""
        self._job.cancel()

    def events(self) -> Iterator[Event]:
        """The request's events, blocking for each; ends after the event with a ``finish_reason``, or on cancel."""
        job = self._job
        try:
            while True:
                item = job.events.get()
                if item is _END or job.cancelled:
                    return
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            if not job.done.is_set():
                job.cancel()  # the consumer stopped reading before the end

    async def aevents(self) -> AsyncIterator[Event]:
        """The same for asyncio code: awaits each event without blocking the event loop (the worker wakes it)."""
        job, loop, flag = self._job, asyncio.get_running_loop(), asyncio.Event()
        job.add_waiter(loop, flag)
        try:
            while True:
                flag.clear()
                try:
                    item = job.events.get_nowait()
                except queue.Empty:
                    await flag.wait()
                    continue
                if item is _END or job.cancelled:
                    return
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            job.remove_waiter(loop, flag)
            if not job.done.is_set():
                job.cancel()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the end of the request and return what it produced (EngineError on timeout)."""
        if not self._job.done.wait(timeout):
            raise EngineError(f"[serve] the request did not finish within {timeout} s")
        assert self._job.result is not None
        return self._job.result


class Engine:
    """Continuous batching over one Session (see the module docstring). ``submit`` is thread-safe."""

    def __init__(self, session: Any, max_sequences: int = 8) -> None:
        if not getattr(session, "generative", False):
            raise EngineError(f"[serve] the engine generates with a decoder LM; {session!r} is not one")
        if max_sequences < 1:
            raise EngineError(f"[serve] max_sequences must be >= 1, found {max_sequences}")
        self.session = session
        self.max_sequences = int(max_sequences)
        self.vocab_size = int(session.graph.tensor("logits").shape[-1])
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._active: list[Job] = []  # holding a sequence; changed by the worker under _cv
        self._closing = False
        self._counts = {"requests_total": 0, "requests_failed": 0, "requests_cancelled": 0,
                        "prompt_tokens_total": 0, "completion_tokens_total": 0, "decode_steps": 0}
        self._hist: dict[int, int] = {}  # decode steps by batch size
        self._recent: deque[tuple[float, int, float]] = deque()  # (end time, tokens, seconds) of decode steps
        self._to_notify: list[Job] = []  # the worker's: jobs with new events, woken once per step (_flush_notify)
        self._thread = threading.Thread(target=self._worker, name="uaii-engine", daemon=True)
        self._thread.start()

    # --- the caller's side ------------------------------------------------------------------------------------
    @property
    def eos_ids(self) -> frozenset[int]:
        """The ids that end a generation unless a request sets ``ignore_eos`` (the model's end of sequence/turn)."""
        return frozenset(self.session.stop_ids)

    def submit(self, req: GenRequest) -> Handle:
        """Queue ``req``; its events come through the returned :class:`Handle`. Checked first (EngineError, nothing
        queued): the prompt and ``max_tokens`` must fit the context, ids must be in the vocabulary."""
        self._validate(req)
        job = Job(req, self._wake, self._defer_notify)
        with self._cv:
            if self._closing:
                raise EngineError("[serve] the engine is closed; it takes no more requests")
            self._queue.append(job)
            self._counts["requests_total"] += 1
            self._cv.notify_all()
        return Handle(job)

    def _validate(self, req: GenRequest) -> None:
        ids, s = req.prompt_ids, self.session
        if not ids:
            raise EngineError("[serve] the prompt is empty (no tokens)")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.vocab_size:
            raise EngineError(f"[serve] prompt token ids must be in [0, {self.vocab_size}), found {lo}..{hi}")
        if isinstance(req.max_tokens, bool) or not isinstance(req.max_tokens, int) or req.max_tokens < 1:
            raise EngineError(f"[serve] max_tokens must be an int >= 1, found {req.max_tokens!r}")
        if req.logprobs is not None and not 0 <= req.logprobs <= self.vocab_size:
            raise EngineError(f"[serve] logprobs must be None or in [0, {self.vocab_size}], found {req.logprobs!r}")
        context = int(s.context)
        if not s.slides and len(ids) + req.max_tokens > context:
            raise EngineError(f"[serve] this model's context is {context} tokens; the request asks for "
                              f"{len(ids) + req.max_tokens} ({len(ids)} in the prompt, max_tokens {req.max_tokens}): "
                              "shorten the prompt or lower max_tokens")

    def stats(self) -> dict[str, Any]:
        """Counters and recent figures: requests total/active/queued (and failed, cancelled), prompt and
        completion tokens, decode tok/s over the last :data:`RECENT_S` seconds of decode steps, decode steps by
        batch size, and the session's storage telemetry (bytes read per token, read GB/s, expert cache hits)."""
        now = time.perf_counter()
        with self._cv:
            out: dict[str, Any] = dict(self._counts)
            out["requests_active"] = len(self._active)
            out["requests_queued"] = len(self._queue)
            recent = [(n, dt) for t, n, dt in self._recent if t >= now - RECENT_S]
            out["batch_size_histogram"] = dict(sorted(self._hist.items()))
        busy = sum(dt for _, dt in recent)
        out["decode_tok_s"] = sum(n for n, _ in recent) / busy if busy > 0 else 0.0
        out["max_sequences"] = self.max_sequences
        out["batched_decode"] = bool(self.session.batched_decode)
        out.update(self._storage())
        return out

    def _storage(self) -> dict[str, Any]:
        try:
            st = self.session.storage_stats()
        except UaiiError:  # the session is closed
            st = {}
        ec = st.get("expert_cache")
        ec = ec if isinstance(ec, dict) else {}
        return {"storage_mode": st.get("mode", ""), "bytes_read": int(st.get("bytes_read", 0)),
                "bytes_read_per_token": float(st.get("bytes_read_per_token", 0.0)),
                "read_gb_s": float(st.get("read_gb_s", 0.0)),
                "expert_cache_hits": int(ec.get("hits", 0)), "expert_cache_misses": int(ec.get("misses", 0))}

    def close(self) -> None:
        """Cancel every request (queued or active), release their sequences and stop the worker (joined). The
        session stays open: it is the caller's."""
        with self._cv:
            self._closing = True
            jobs = [*self._queue, *self._active]
            self._cv.notify_all()
        for job in jobs:
            job.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _defer_notify(self, job: Job) -> bool:
        """Events the worker emits wake their asyncio consumers after the step, all of one loop in one wake-up
        (a decode step of N rows is N events): True when deferred. Any other thread's wake-up (a cancel) is at
        once."""
        if threading.current_thread() is not self._thread:
            return False
        self._to_notify.append(job)
        return True

    def _flush_notify(self) -> None:
        if self._to_notify:
            jobs, self._to_notify = self._to_notify, []
            wake_waiters([w for job in dict.fromkeys(jobs) for w in job.waiters()])

    # --- the worker -------------------------------------------------------------------------------------------
    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self._queue and not self._active:
                    self._cv.wait()
                if self._closing:
                    break
            try:
                self._iteration()
            except Exception as exc:  # a bug: never a silent death of the worker
                log.exception("[serve] engine step failed; failing the active requests")
                self._fail_all(f"[serve] internal error in the engine: {type(exc).__name__}: {exc}")
            finally:
                self._flush_notify()
        for job in list(self._active):
            self._drop(job)
        with self._cv:
            queued, self._queue = list(self._queue), deque()
        for job in queued:
            job.cancel()

    def _fail_all(self, message: str) -> None:
        """End every active request with ``message``; whatever fails here too is logged, never raised."""
        for job in list(self._active):
            try:
                self._finish(job, "error", message)
            except Exception:
                log.exception("[serve] could not end a request cleanly")
                job.cancel()
                self._drop(job)

    def _iteration(self) -> None:
        self._reap()
        self._admit()
        self._prefill_some()
        self._flush_notify()  # first tokens go out before the decode step
        self._reap()
        decoding = [j for j in self._active if j.pending is not None]
        if decoding:
            self._decode_step(decoding)

    def _reap(self) -> None:
        """Release the sequences of cancelled requests (before the next pass)."""
        for job in [j for j in self._active if j.cancelled]:
            with self._cv:
                self._counts["requests_cancelled"] += 1
            self._drop(job)

    def _admit(self) -> None:
        """Queued requests become sequences while fewer than ``max_sequences`` are active and the memory budget
        holds one more KV state (``session.sequence_fits``): a request waits until a sequence ends and frees its
        memory, and is never admitted over the budget. One that cannot fit even with nothing active fails."""
        while True:
            with self._cv:
                if not self._queue or len(self._active) >= self.max_sequences:
                    return
                idle = not self._active
            if not self._fits():
                if not idle:
                    return  # the active sequences free memory as they end
                with self._cv:
                    job = self._queue.popleft()
                    self._active.append(job)
                self._finish(job, "error", f"[serve] the memory budget cannot hold one more sequence's KV state "
                                           f"({self.session.sequence_bytes} bytes) beside what the session holds "
                                           f"({self.session.memory_bytes()} bytes); raise the budget or lower "
                                           "max_context")
                continue
            with self._cv:
                if not self._queue:
                    return
                job = self._queue.popleft()
                if job.cancelled:
                    self._counts["requests_cancelled"] += 1
                    continue
                self._active.append(job)
            try:
                job.seq = self.session.new_sequence()
                job.sampler = make_sampler(job.req.sampling)
                job.text = TextStream(self.session.tokenizer, job.req.stop)
            except UaiiError as exc:
                self._finish(job, "error", str(exc))

    def _fits(self) -> bool:
        fits = getattr(self.session, "sequence_fits", None)  # a session without a budget check always fits
        return bool(fits()) if fits is not None else True

    def _prefill_some(self) -> None:
        """Up to one chunk of prompt tokens over the requests still prefilling, oldest first."""
        budget = int(self.session.prefill_chunk)
        for job in [j for j in self._active if j.prefilling and not j.cancelled]:
            if budget <= 0:
                return
            ids = job.req.prompt_ids[job.fed:job.fed + budget]
            try:
                logits = self.session.prefill(job.seq, ids)
            except UaiiError as exc:
                self._finish(job, "error", str(exc))
                continue
            job.fed += len(ids)
            budget -= len(ids)
            if not job.prefilling:
                with self._cv:
                    self._counts["prompt_tokens_total"] += job.fed
                self._sampled(job, logits)

    def _decode_step(self, jobs: list[Job]) -> None:
        t0 = time.perf_counter()
        try:
            logits = self.session.decode([j.seq for j in jobs], [j.pending for j in jobs])
        except UaiiError as exc:
            if len(jobs) == 1:
                self._finish(jobs[0], "error", str(exc))
                return
            log.warning("[serve] a decode step of %d sequences failed (%s); running them one by one", len(jobs), exc)
            for job in jobs:  # the call was all-or-nothing: each runs again alone, the failing ones end
                self._decode_step([job])
            return
        dt = time.perf_counter() - t0
        with self._cv:
            self._counts["decode_steps"] += 1
            self._hist[len(jobs)] = self._hist.get(len(jobs), 0) + 1
            self._recent.append((t0 + dt, len(jobs), dt))
            while self._recent and self._recent[0][0] < t0 - RECENT_S:
                self._recent.popleft()
        for job, row in zip(jobs, logits, strict=True):
            self._sampled(job, row)

    def _sampled(self, job: Job, logits: np.ndarray) -> None:
        """Choose the request's next token from ``logits``, emit it, and end the request when it should stop."""
        job.pending = None
        req = job.req
        try:
            history = [*req.prompt_ids, *job.out] if job.sampler.wants_history else req.prompt_ids
            token = int(job.sampler(logits, history))
        except UaiiError as exc:
            self._finish(job, "error", str(exc))
            return
        now = time.perf_counter()
        if job.first_at is None:
            job.first_at = now
        if token in req.stop_token_ids or (not req.ignore_eos and token in self.session.stop_ids):
            self._finish(job, "stop")
            return
        job.out.append(token)
        job.last_at = now
        with self._cv:
            self._counts["completion_tokens_total"] += 1
        text = job.text
        assert text is not None  # set when the job was admitted
        piece = text.push(token)
        lp, top = self._logprobs(logits, token, req.logprobs)
        job.emit(Event(token, piece, lp, top, None, None))
        if text.stopped:
            self._finish(job, "stop")
        elif len(job.out) >= req.max_tokens or self.session.bounds.full(job.seq.length):
            self._finish(job, "length")
        else:
            job.pending = token

    def _logprobs(self, logits: np.ndarray, token: int,
                  k: int | None) -> tuple[float | None, list[tuple[int, str, float]] | None]:
        """The chosen token's log-probability and the top ``k`` (id, piece, logprob), from a float64 log-softmax."""
        if k is None:
            return None, None
        x = np.asarray(logits, np.float64)
        top = float(x.max())
        lse = top + float(np.log(np.exp(x - top).sum()))
        chosen = float(x[token] - lse)
        if k == 0:
            return chosen, []
        ids = np.argpartition(-x, k - 1)[:k] if k < x.shape[0] else np.arange(x.shape[0])
        ids = ids[np.argsort(-x[ids], kind="stable")]
        return chosen, [(int(i), self._piece(int(i)), float(x[i] - lse)) for i in ids]

    def _piece(self, token: int) -> str:
        tok = self.session.tokenizer
        return str(tok.decode([token], skip_special=False)) if tok is not None else ""

    def _finish(self, job: Job, reason: str, error: str | None = None) -> None:
        """End ``job``: its sequence is released, then the last event (held-back text, reason, usage) is sent."""
        self._drop(job)
        tail = job.text.finish() if job.text is not None and reason != "error" else ""
        n, p = len(job.out), len(job.req.prompt_ids)
        ttft = (job.first_at - job.submitted) if job.first_at is not None else 0.0
        span = (job.last_at - job.first_at) if job.last_at is not None and job.first_at is not None else 0.0
        usage = Usage(p, n, p + n, ttft_s=ttft, decode_tok_s=(n - 1) / span if n > 1 and span > 0 else 0.0)
        text = job.text.text if job.text is not None else ""
        if error is not None:
            with self._cv:
                self._counts["requests_failed"] += 1
        job.finish(Event(None, tail, None, None, reason, usage, error), Result(text, list(job.out), reason, usage,
                                                                                 error))

    def _drop(self, job: Job) -> None:
        """Release the job's sequence and take it off the active list (idempotent)."""
        if job.seq is not None:
            try:
                self.session.release(job.seq)
            except Exception:
                log.exception("[serve] could not release %r", job.seq)
        with self._cv:
            if job in self._active:
                self._active.remove(job)


__all__ = ["Engine", "EngineError", "Event", "GenRequest", "Handle", "Result", "Usage"]
