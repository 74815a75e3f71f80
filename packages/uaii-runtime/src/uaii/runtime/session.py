"""The Session: load → plan → compile, then generate (batched prefill, in-place KV cache, one token per decode step).

    with Session("SmolLM2-135M-Instruct.Q4_1.gguf") as s:
        print(s.generate("The capital of France is", max_new_tokens=16).text)

Lifecycle: CREATED → LOADED → PLANNED → READY → CLOSED (:class:`SessionState`); using a closed session is a
:class:`SessionError`. Decoder LMs are rewritten to compute the lm_head for the last row only, planned by
uaii.planner (disk cache), compiled on the selected backend, and given a KV state of ``max_context`` tokens (or a
``kv_window`` + ``kv_sinks`` resident window). The cache survives between calls: a prompt that extends what the
cache holds (a chat turn) only prefills the new tokens.

Three rules hold whatever the caller does:

* the history (the tokens the cache holds) and the KV state agree: a forward pass and its bookkeeping happen
  together or not at all, whatever exception (KeyboardInterrupt included) arrives (:meth:`Session._pass`);
* one call at a time: threads are serialized, reentrant use raises, close() waits for the pass in flight
  (:mod:`uaii.runtime.guard`);
* positions never pass the context (``max_context``, at most what the model was trained on), whatever the
  window: a window bounds memory, not positions. Only ``kv_positions="cache"`` with a window keeps the positions
  below the window, so that generation may slide on past the context (:mod:`uaii.runtime.bounds`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.ir import Graph, UaiiError
from uaii.runtime.bounds import ContextBounds
from uaii.runtime.budget import bytes_per_token, check_memory, storage_stats
from uaii.runtime.build import build_executable
from uaii.runtime.capabilities import check_backend, compile_options, kv_state_options
from uaii.runtime.errors import SessionError
from uaii.runtime.generate import TextStream, common_prefix, make_sampler
from uaii.runtime.gpu_budget import DeviceResidency
from uaii.runtime.guard import SessionGuard
from uaii.runtime.model import ModelBundle, load_bundle
from uaii.runtime.options import SessionOptions
from uaii.runtime.planning import kv_slots, replan, session_plan
from uaii.runtime.results import GenerationResult, GenerationStats, ModelInfo, SessionState, peak_rss_bytes
from uaii.runtime.rewrite import last_token_logits
from uaii.runtime.sequences import SequencesMixin, agree

if TYPE_CHECKING:
    from uaii.backends import StepProfile
    from uaii.backends.base import Backend, Executable, KVStateLike

log = logging.getLogger("uaii.runtime")
OnPrefill = Callable[[int, int], object]


class Session(SequencesMixin):
    """A model ready to run. See the module docstring; options are :class:`SessionOptions` fields. Besides its own
    conversation, a session runs any number of independent sequences (:class:`~uaii.runtime.sequences.SequencesMixin`:
    ``new_sequence``, ``prefill``, ``decode``, ``release``)."""

    def __init__(self, path: str | Any, **options: Any) -> None:
        self._guard = SessionGuard(self._free)
        self.options = SessionOptions.from_kwargs(options)
        self.state = SessionState.CREATED
        self.last_result: GenerationResult | None = None
        self.plan: Any = None
        self.plan_cache_hit = False
        self.backend: Backend | None = None
        self._exe: Executable | None = None
        self._store: Any = None
        self._stream_kw: dict[str, Any] = {}
        self.device_residency: DeviceResidency | None = None  # W4: weights on a device backend (gpu_budget.py)
        self._device_kw: dict[str, Any] = {}  # W4: the streaming compile options with the device's streamed list
        self._kv: KVStateLike | None = None
        self._full: Executable | None = None  # functional executable for run() on a decoder graph
        self._profiled: list[Executable] | None = None  # set_profiling(True): the executables timing their steps
        self._given = dict(options)  # as the caller gave them: a pipeline's stages resolve them on their nodes
        self._init_sequences()  # several sequences and batched decode (uaii.runtime.sequences)
        self._history: list[int] = []  # tokens whose keys and values the cache holds
        # the last prompt's length and the logits its prefill ended with: a repeated prompt reuses them as they
        # are, where re-feeding its last token (the decode path) would give logits that differ in the last bits
        self._prompt_logits: tuple[int, np.ndarray] | None = None
        t0 = time.perf_counter()
        self._bundle: ModelBundle = load_bundle(path)
        self.tokenizer = self._bundle.tokenizer
        self.model_info: ModelInfo | None = self._bundle.info
        self.state = SessionState.LOADED
        try:
            self._setup()
        except BaseException:
            self.close()  # give back what was mapped or compiled before the failure
            raise
        self.load_s = time.perf_counter() - t0

    # --- setup ---------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        from uaii.backends import select_device

        o, b = self.options, self._bundle
        self.backend = backend = select_device(o.device)
        check_backend(backend, o, generative=b.generative, model=b.path.name)  # before anything is built
        if o.n_threads is not None:
            backend.set_threads(o.n_threads)
        self.bounds, self.options = ContextBounds.of(b, o)
        self.context = self.bounds.context  # tokens a sequence may hold (see uaii.runtime.bounds)
        self.trained_context = self.bounds.trained  # positions the model was trained on (0: unknown)
        o = self.options
        self._chunk = min(o.max_batch, o.kv_window) if o.kv_window else o.max_batch  # tokens per prefill pass
        graph = last_token_logits(b.graph) if b.generative else b.graph
        self.graph = graph
        if not b.generative and o.kv_positions != "absolute":
            raise SessionError(f"[runtime] option kv_positions={o.kv_positions!r} needs a decoder with a KV cache; "
                               f"{b.path.name} has none")
        if o.pipeline > 1:
            self._setup_pipeline(graph)
        else:
            # the budget less the KV states of options.sequences sequences (SequencesMixin._reserved_plan)
            self.plan, self.plan_cache_hit, self._own_options = self._reserved_plan(graph)
            self.state = SessionState.PLANNED
            unplanned = self._build(graph)
            if unplanned:  # the backend allocates bytes the plan does not count: plan once more without them
                self._unbuild()
                self.plan, self.plan_cache_hit = replan(graph, self._bundle, self._own_options, backend=backend,
                                                        context=self.context, unplanned=unplanned)
                self._build(graph, final=True)
            self.bytes_per_token = bytes_per_token(graph, b.locations, self.plan)
        self._tokens = np.zeros(o.max_batch, np.int64)
        self._positions = np.zeros(o.max_batch, np.int64)
        self._decode_feeds = {"tokens": self._tokens[:1], "positions": self._positions[:1]}
        self.state = SessionState.READY

    def _setup_pipeline(self, graph: Graph) -> None:
        """``options.pipeline`` stages instead of one executable (uaii.runtime.pipeline): the stages plan and hold
        their own layers under their own budgets on their nodes; this process holds no weights."""
        from uaii.runtime.pipeline import open_pipeline

        b = self._bundle
        if not b.generative:
            raise SessionError(f"[runtime] option pipeline={self.options.pipeline}: {b.path.name} is not a decoder "
                               "LM with a KV cache; only those run as pipeline stages")
        self._own_options = self.options
        exe = open_pipeline(b.path, graph, self.options, self._given, self.context)
        self._exe = exe
        self.state = SessionState.PLANNED
        self._kv = self._new_kv_state(exe)
        self.bytes_per_token = sum(i.bytes_per_token for i in exe.infos)

    @property
    def pipeline(self) -> list[Any]:
        """The stages of a pipeline session (:class:`uaii.runtime.pipeline.StageInfo`: layers, node, budget,
        pinned and streamed bytes, what crosses to the next); empty for a session in one process."""
        return list(getattr(self._exe, "infos", ()))

    def _build(self, graph: Graph, final: bool = False) -> int:
        """The store, the executable and the KV state for ``self.plan``; then what the executable reports it
        allocates is held to the budget (:func:`uaii.runtime.budget.check_memory`): returns the bytes it allocates
        beyond the plan's estimate when that is over the budget and another plan may fit (not ``final``), else 0."""
        o, b, backend = self.options, self._bundle, self.backend
        assert backend is not None
        built = build_executable(graph, self.plan, b, o, backend, kv_slots=self._kv_slots(), cached=b.generative)
        self._exe, self._store, self._stream_kw = built.exe, built.store, built.stream_kw
        self.device_residency, self._device_kw = built.device_residency, built.device_kw
        if b.generative:
            self._kv = self._new_kv_state(self._exe)
        return check_memory(backend, self._exe, self._kv, self._own_options, self.plan, enforced=bool(built.stream_kw),
                            final=final)

    def _unbuild(self) -> None:
        """Give back what :meth:`_build` made (before building for another plan)."""
        self._drop_batch()
        for obj in (self._exe, self._store):
            if obj is not None:
                obj.close()
        self._exe = self._store = self._kv = None
        self._stream_kw = {}

    @property
    def slides(self) -> bool:
        """Whether generation may go on past the context: a window whose positions are cache slots
        (``kv_positions="cache"``), which stay below the window. Absolute positions stop at the context."""
        return self.bounds.slides

    @property
    def has_rope(self) -> bool:
        """Whether the model's positions are rotary (a RoPE node in the graph): only those can be cache slots."""
        return self.bounds.rope

    def _new_kv_state(self, exe: Executable) -> KVStateLike:
        o = self.options
        kv_kw = kv_state_options(o, self.context)
        try:
            return exe.new_state(self.context, **kv_kw)
        except UaiiError as exc:
            if "positions" not in kv_kw:
                raise
            raise SessionError(f"[runtime] option kv_positions={o.kv_positions!r} does not apply to "
                               f"{self._bundle.path.name}: {exc}") from None

    def storage_stats(self) -> dict[str, Any]:
        """The storage telemetry of this session (see :func:`uaii.runtime.budget.storage_stats`)."""
        with self._guard.cv:  # not while close() frees the store
            return storage_stats(self._store, self.plan, self._exe)

    @property
    def streaming(self) -> bool:
        """Whether some weights stream under the budget (False: memory-mapped, or every weight pinned)."""
        return bool(self._stream_kw.get("streamed"))

    def _run(self, feeds: Mapping[str, np.ndarray], state: Any, exe: Executable | None = None) -> dict[str, np.ndarray]:
        """One forward pass of the decoder on ``state`` (the session's KV state, a sequence's, or a KVBatch of
        them) with ``exe`` (default: the session's executable); a streaming store counts it as one token of
        telemetry."""
        exe = exe if exe is not None else self._exe
        assert exe is not None  # the guard lets no pass start on a closed session
        if self._profiled is not None and exe not in self._profiled:
            exe.set_profiling(True)  # type: ignore[attr-defined]  # Capabilities.step_profile: set_profiling checked
            self._profiled.append(exe)
        if not self._stream_kw:
            return exe.run(feeds, state)
        self._store.begin_token()
        try:
            return exe.run(feeds, state)
        finally:
            self._store.end_token()

    # --- profiling -----------------------------------------------------------------------------------------
    def set_profiling(self, on: bool = True) -> None:
        """Time every step of every forward pass from now on (the executables a pass uses start timing at their
        first pass), or stop. Only on a backend that declares :attr:`~uaii.backends.Capabilities.step_profile`."""
        backend = self.backend
        if on and self.options.pipeline > 1:
            raise SessionError("[runtime] a pipeline session's stages run on their nodes: no step profile here")
        if on and (backend is None or not backend.capabilities.step_profile):
            name = getattr(backend, "name", "none")
            raise SessionError(f"[runtime] backend {name!r} does not time its steps (its capabilities do not "
                               f"declare step_profile): no profile on this device")
        for exe in self._profiled or ():
            exe.set_profiling(False)  # type: ignore[attr-defined]
        self._profiled = [] if on else None

    def take_profile(self) -> list[StepProfile]:
        """What the passes since the last take spent, per step and op family, one profile per rows fed per pass
        (decode steps: 1; prefill chunks: their length); see :mod:`uaii.backends.profile`."""
        from uaii.backends import merge_profiles

        return merge_profiles(p for exe in self._profiled or () for p in exe.take_profile())  # type: ignore[attr-defined]

    def _plan(self, graph: Graph, budget: int) -> tuple[Any, bool]:
        assert self.backend is not None
        return session_plan(graph, self._bundle, self.options, backend=self.backend, context=self.context,
                            budget=budget)

    def _kv_slots(self) -> int:
        return kv_slots(self.options, self.context)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def _ready(self, what: str) -> None:
        if self.state is SessionState.CLOSED:
            raise SessionError(f"[runtime] cannot {what}: the session is closed")
        if self.state is not SessionState.READY:
            raise SessionError(f"[runtime] cannot {what}: the session is {self.state.value}, not ready")

    @property
    def generative(self) -> bool:
        """Whether the model is a decoder LM this session generates with: tokens and positions in, logits out, a
        KV cache (else only run() applies)."""
        return self._bundle.generative

    def _generative(self, what: str) -> None:
        self._ready(what)
        if self._kv is None:
            why = self._bundle.graph.meta.get("onnx.kv", "")  # an ONNX model says why its KV I/O did not map
            reason = why.removeprefix("none: ") if why.startswith("none:") else ""
            detail = f"it cannot decode incrementally: {reason}" if reason else \
                "no tokens/positions inputs with a KV cache"
            raise SessionError(f"[runtime] cannot {what}: {self._bundle.path.name} is not a generative model "
                               f"({detail}); use run()")

    def close(self) -> None:
        """Free the compiled graph, the KV cache and the weight maps (idempotent). Safe from any thread: a
        generation in flight stops before its next forward pass (SessionError) and the memory is freed once that
        pass is over; a stream suspended at a piece raises SessionError when resumed. Called from ``on_token``,
        the generation stops and the session closes when it returns."""
        self._guard.close()

    def _free(self) -> None:
        """Called once, by the guard (see SessionGuard._close_now)."""
        self._close_sequences()
        if self._embedder is not None:  # the hidden-state executable of embed() (uaii.runtime.embedding)
            self._embedder.close()
        for obj in (self._exe, self._full, self._batch_exe, self._store):
            if obj is not None:
                obj.close()
        self._exe = self._full = self._batch_exe = self._store = self._kv = None
        self.state = SessionState.CLOSED

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Session {self._bundle.path.name} {self.state.value} on {getattr(self, 'backend', None)}>"

    def reset(self) -> None:
        """Forget the conversation: the KV cache is emptied."""
        with self._guard.hold("reset"):
            self._ready("reset")
            if self._kv is not None:
                self._kv.reset()
            self._history = []
            self._prompt_logits = None

    @property
    def stop_ids(self) -> frozenset[int]:
        """The token ids that end a generation (end of sequence, end of turn), from the model and its tokenizer."""
        return self._bundle.stop_ids

    @property
    def prefill_chunk(self) -> int:
        """Tokens per prefill pass (``max_batch``, at most the window): a longer prompt runs in chunks of this many."""
        return self._chunk

    @property
    def kv_length(self) -> int:
        """Tokens the KV cache holds."""
        return len(self._history)

    # --- tokens ------------------------------------------------------------------------------------------
    def _tok(self, what: str) -> Any:
        self._ready(what)
        if self.tokenizer is None:
            raise SessionError(f"[runtime] cannot {what}: {self._bundle.path.name} has no tokenizer")
        return self.tokenizer

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(self._tok("tokenize").encode(text, add_special=add_special))

    def detokenize(self, ids: Sequence[int]) -> str:
        return str(self._tok("detokenize").decode([int(i) for i in ids]))

    # --- forward passes ------------------------------------------------------------------------------------
    def _feed(self, ids: list[int], on_prefill: OnPrefill | None = None) -> np.ndarray:
        """Run ``ids`` through the model in chunks (max_batch, at most the window); return the last token's logits
        (a view). ``on_prefill(done, total)`` is called before and after each chunk of a prefill of more than one."""
        if not ids:
            raise SessionError("[runtime] nothing to run: the token list is empty")
        self.bounds.check(len(ids), len(self._history))
        self._check_ids(ids)
        return self._chunked(ids, self._pass, on_prefill)

    def _chunked(self, ids: list[int], run: Callable[[list[int]], np.ndarray],
                 on_prefill: OnPrefill | None) -> np.ndarray:
        """``run`` over ``ids`` in chunks of the prefill chunk; the last token's logits. ``on_prefill(done, total)``
        before and after each chunk of a prefill of more than one (the session's own state and every sequence's)."""
        step, total = self._chunk, len(ids)
        progress = on_prefill if on_prefill is not None and total > step else None
        if progress is not None:
            progress(0, total)
        logits = None
        for start in range(0, total, step):
            logits = run(ids[start:start + step])
            if progress is not None:
                progress(min(start + step, total), total)
        assert logits is not None
        return logits[-1]

    def _pass(self, ids: list[int]) -> np.ndarray:
        """One forward pass over ``ids`` (at most one chunk); returns the logits (a view). The KV state and the
        history change together or not at all: an exception anywhere in here, KeyboardInterrupt included, rewinds
        the state to the history (:meth:`_resync`), so the next call never answers from tokens it does not know."""
        self._guard.check_open()
        n = len(ids)
        tokens, positions = self._tokens[:n], self._positions[:n]
        try:
            tokens[:] = ids
            first = self._next_position(n)
            positions[:] = np.arange(first, first + n)
            out = self._run({"tokens": tokens, "positions": positions}, self._kv)
            self._history.extend(ids)
        except BaseException:
            self._resync()
            raise
        return out["logits"]

    def _step(self, token: int) -> np.ndarray:
        """One decode step (the hot loop): feed one token, return its logits (a view). All or nothing, as _pass."""
        self._guard.check_open()
        try:
            self._tokens[0] = token
            self._positions[0] = self._next_position(1)
            out = self._run(self._decode_feeds, self._kv)
            self._history.append(token)
        except BaseException:
            self._resync()
            raise
        return out["logits"][-1]

    def _resync(self) -> None:
        """Make the history and the KV state agree again after a pass that did not finish (the state ran ahead:
        it is truncated; a state that cannot rewind, or that reset itself mid-way, empties both). Cheap enough to
        run before every call too, which catches an interrupt that hit this very repair."""
        if self._kv is None:
            return
        agree(self._kv, self._history)
        if self._prompt_logits is not None and self._prompt_logits[0] > len(self._history):
            self._prompt_logits = None  # the tokens those logits came from are gone from the cache

    def _next_position(self, n: int, kv: KVStateLike | None = None) -> int:
        """The rotary position of the first of the next ``n`` tokens of ``kv`` (default: the session's state). With
        kv_positions="cache" it is a cache slot, known only once the state has made room for them (see
        KVState.reserve)."""
        kv = kv if kv is not None else self._kv
        assert kv is not None  # only generative sessions run passes
        if self.options.kv_positions == "absolute":
            return int(kv.length)
        return int(kv.reserve(n))

    def _check_ids(self, ids: Sequence[int]) -> None:
        """Checked before any pass: a bad id runs nothing."""
        lo, hi = min(ids), max(ids)
        vocab = self._vocab()
        if lo < 0 or hi >= vocab:
            raise SessionError(f"[runtime] token ids must be in [0, {vocab}), found {lo}..{hi}")

    def _vocab(self) -> int:
        return int(self.graph.tensor("logits").shape[-1])

    def forward(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits (float32, a copy) of the last of ``tokens``, which are appended to the KV cache."""
        with self._guard.hold("run forward"):
            self._generative("run forward")
            self._resync()
            return np.array(self._feed([int(t) for t in tokens]), dtype=np.float32)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a graph on named inputs, returning every graph output (copies). On a decoder LM this is the
        functional graph: feed ``past_k.N``/``past_v.N`` (shape [0, heads, dim] for none) and get all logits."""
        with self._guard.hold("run"):
            self._ready("run")
            feeds = {k: np.asarray(v) for k, v in inputs.items()}
            exe = self._exe
            if self._kv is not None:
                if self._full is None:
                    assert self.backend is not None
                    self._full = self.backend.compile(
                        self._bundle.graph, None, self._store,
                        **compile_options(self.backend.capabilities, self.options, self._device_kw, kv_state=False))
                exe = self._full
            assert exe is not None
            missing = [n for n in exe.input_names if n not in feeds]
            if missing:
                raise SessionError(f"[runtime] missing input(s) {', '.join(missing)}; the graph takes "
                                   f"{', '.join(exe.input_names)}")
            return {k: np.array(v) for k, v in exe.run(feeds).items()}

    _embedder: Any = None  # uaii.runtime.embedding.Embedder, made by the first embed()

    def embed(self, inputs: str | Sequence[Any]) -> np.ndarray:
        """Unit-norm embeddings ``[n, d]`` (float32) of a text, texts, or token-id lists: an encoder's pooled
        output, a decoder LM's mean final hidden state (:mod:`uaii.runtime.embedding`). The conversation cache and
        the sequences are left as they are."""
        from uaii.runtime.embedding import embed

        return embed(self, inputs)

    # --- generation ----------------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 128, sampling: Any = None,
                 stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (), add_special: bool = True,
                 ignore_eos: bool = False, on_token: Callable[[int, str], object] | None = None,
                 on_prefill: OnPrefill | None = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, or token ids used as they are).

        ``on_token(token_id, text_piece)`` is called for every generated token as it is sampled (the piece may be
        empty while a character or a possible stop string is incomplete); a true return value stops generation
        there (finish reason "stop"). The text still held back at the end is in ``result.text``.
        ``on_prefill(done, total)`` reports a prefill of more than one chunk (a progress bar)."""
        for _ in self._generation(prompt, max_new_tokens, sampling, stop, stop_token_ids, add_special, ignore_eos,
                                  stream=False, on_token=on_token, on_prefill=on_prefill):
            pass
        assert self.last_result is not None
        return self.last_result

    def stream(self, prompt: str | Sequence[int], *, max_new_tokens: int = 128, sampling: Any = None,
               stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (), add_special: bool = True,
               ignore_eos: bool = False, on_prefill: OnPrefill | None = None) -> Iterator[str]:
        """Text pieces as they are generated; the full result is ``session.last_result`` afterwards. The session
        is the stream's until it ends or is closed: other threads wait, this thread gets a SessionError."""
        return self._generation(prompt, max_new_tokens, sampling, stop, stop_token_ids, add_special, ignore_eos,
                                stream=True, on_prefill=on_prefill)

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> GenerationResult:
        """Reply to ``messages`` ([{"role": ..., "content": ...}]) through the model's chat template."""
        tok = self._tok("chat")
        ids = tok.encode_chat(messages, add_generation_prompt=True)
        kwargs["add_special"] = False
        return self.generate(ids, **kwargs)

    def _prompt_ids(self, prompt: str | Sequence[int], add_special: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special=add_special)
        return [int(t) for t in prompt]

    def _generation(self, prompt: str | Sequence[int], max_new: int, sampling: Any, stop: Sequence[str],
                    stop_ids: Sequence[int], add_special: bool, ignore_eos: bool, stream: bool,
                    on_token: Callable[[int, str], object] | None = None,
                    on_prefill: OnPrefill | None = None) -> Iterator[str]:
        with self._guard.hold("generate"):
            self._generative("generate")
            self.last_result = None  # never mistaken for this call's result if it fails before it has one
            self._resync()
            if isinstance(stop, str):
                stop = (stop,)
            if max_new < 0:
                raise SessionError(f"[runtime] max_new_tokens must be >= 0, found {max_new}")
            sampler = make_sampler(sampling)
            ids = self._prompt_ids(prompt, add_special)
            if not ids:
                raise SessionError("[runtime] the prompt is empty (no tokens); pass text or token ids")
            if not self.slides:  # a prompt longer than the context is refused before anything runs
                self.bounds.check(len(ids), 0)
            text = TextStream(self.tokenizer, stop) if (stream or stop or on_token is not None) else None
            eos = frozenset() if ignore_eos else self._bundle.stop_ids
            yield from self._decode(ids, max_new, sampler, text, eos, frozenset(int(t) for t in stop_ids), stream,
                                    on_token, on_prefill)

    def _decode(self, ids: list[int], max_new: int, sampler: Any, text: TextStream | None, eos: frozenset[int],
                stops: frozenset[int], stream: bool, on_token: Callable[[int, str], object] | None,
                on_prefill: OnPrefill | None) -> Iterator[str]:
        """Prefill, then one token per step until a stop; ``last_result`` is set however it ends."""
        stats = GenerationStats(prompt_tokens=len(ids), load_s=self.load_s, plan_cache_hit=self.plan_cache_hit,
                                bytes_read_per_token=float(self.bytes_per_token))
        out: list[int] = []
        finish = "length"
        t0 = time.perf_counter()
        tail = ""
        try:
            if max_new == 0:
                return
            kv = self._kv
            assert kv is not None  # _generative() checked
            read0 = self._bytes_read()
            logits = self._prefill(ids, stats, on_prefill)
            reuse = stats.cached_tokens
            t1 = time.perf_counter()
            stats.prefill_s = t1 - t0
            stats.prefill_tok_s = (len(ids) - reuse) / stats.prefill_s if stats.prefill_s > 0 else 0.0
            history = ids
            steps = 0
            while True:
                token = sampler(logits, history)
                if not out:
                    stats.ttft_s = time.perf_counter() - t0
                if token in stops:
                    finish = "stop"
                    break
                if token in eos:
                    finish = "eos"
                    break
                out.append(token)
                piece = ""
                if text is not None:
                    piece = text.push(token)
                    if piece and stream:
                        with self._guard.suspended():
                            yield piece
                if on_token is not None and on_token(token, piece):
                    finish = "stop"
                    break
                if text is not None and text.stopped:
                    finish = "stop"
                    break
                if len(out) >= max_new or self.bounds.full(kv.length):
                    break
                logits = self._step(token)
                steps += 1
                history = [*history, token] if sampler.wants_history else history
            stats.decode_s = time.perf_counter() - t1
            stats.decode_tok_s = steps / stats.decode_s if steps and stats.decode_s > 0 else 0.0
            if self._stream_kw:  # measured: file bytes the passes of this generation read, per pass
                passes = steps + -(-(len(ids) - reuse) // self._chunk)
                stats.bytes_read_per_token = (self._bytes_read() - read0) / max(passes, 1)
        except BaseException:  # interrupted, closed, or the caller stopped reading the stream
            finish = "stop"
            raise
        finally:
            stats.new_tokens = len(out)
            stats.peak_rss_bytes = peak_rss_bytes()
            if text is not None:
                tail = text.finish()
                result_text = text.text
            else:
                result_text = self.tokenizer.decode(out) if self.tokenizer is not None else ""
            self.last_result = GenerationResult(result_text, out, ids, finish, stats)
        if tail and stream:
            with self._guard.suspended():
                yield tail  # what the decoder and the stop-string window held back

    def _prefill(self, ids: list[int], stats: GenerationStats, on_prefill: OnPrefill | None) -> np.ndarray:
        """The logits after the prompt: the tokens the cache lacks are fed (a repeated prompt's are kept)."""
        reuse, saved = self._reuse(ids)
        stats.cached_tokens = reuse
        if saved is not None:
            return saved
        logits = self._feed(ids[reuse:], on_prefill)
        self._prompt_logits = (len(ids), np.array(logits, dtype=np.float32))
        return logits

    def _bytes_read(self) -> int:
        if not self._stream_kw:
            return 0
        return int(self._store.telemetry.snapshot().get("bytes_read", 0))

    def _reuse(self, ids: list[int]) -> tuple[int, np.ndarray | None]:
        """How many leading prompt tokens the cache already holds (the cache is rewound to them), and the logits of
        the last prompt token when the whole prompt is the previous prompt, whose prefill logits are kept: a
        repeated prompt then samples from the logits the first call sampled from (on a fresh session: the ones a
        fresh session computes), where re-feeding its last token alone runs the decode path, whose results differ
        in the last bits from a batched prefill and can change a seeded draw. Otherwise the last prompt token is
        run again. A windowed cache that cannot rewind starts over (both emptied)."""
        common = common_prefix(self._history, ids)
        saved = self._prompt_logits
        whole = saved is not None and common == len(ids) == saved[0]
        keep = len(ids) if whole else min(common, len(ids) - 1)
        if keep < len(self._history):
            try:
                del self._history[keep:]
            finally:
                self._resync()  # the state follows: truncated, or emptied with the history if it cannot rewind
        if whole and saved is not None and len(self._history) == len(ids):
            return len(ids), saved[1].copy()
        return len(self._history), None


__all__ = ["Session"]
