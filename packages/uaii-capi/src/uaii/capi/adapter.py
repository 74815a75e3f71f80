"""The Python object behind a ``uaii_session*``: a ``uaii.runtime.Session`` plus what the C API adds to it.

Additions: option translation (C struct -> Session options, with the C-only options checked or recorded as
warnings), IR files whose weights are relocated or filled (resolved by uaii.capi.irmodel, run by the same Session
as any other model), named f32 inputs/outputs for
``uaii_session_run``, the profiler, generation statistics and the per-token callback (uaii.capi.generation), and a
per-session lock that serializes calls from several threads and refuses re-entry from a callback.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from uaii.capi import generation
from uaii.capi.irmodel import ResolvedWeights, is_ir_path, resolve_weights
from uaii.capi.options import ComputeDType, GenerateConfig, GenerationStats, SessionConfig
from uaii.capi.profiler import Profiler
from uaii.capi.status import CapiError, Status, invalid
from uaii.ir import Graph, Tensor, WeightRef

F = TypeVar("F", bound=Callable[..., Any])


def _exclusive(fn: F) -> F:
    """One call at a time per session; a call from inside the same session's callback is refused."""

    @functools.wraps(fn)
    def call(self: CapiSession, *args: Any, **kwargs: Any) -> Any:
        me = threading.get_ident()
        if self._owner == me:
            raise invalid("the session is already running a call on this thread (re-entered from its on_token "
                          "callback?)")
        with self._lock:
            self._owner = me
            try:
                return fn(self, *args, **kwargs)
            finally:
                self._owner = None

    return call  # type: ignore[return-value]


@contextmanager
def _captured_warnings(into: list[str]) -> Iterator[None]:
    """Warnings the uaii packages log while the body runs become session warnings (not stderr noise)."""

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(record.getMessage())

    handler = Capture(logging.WARNING)
    logger = logging.getLogger("uaii")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def session_options(config: SessionConfig) -> dict[str, Any]:
    """Session keyword options from the C options; only values that differ from the defaults, so that a
    preset still fills what the caller left alone."""
    from uaii.runtime import PresetError, SessionError, SessionOptions

    kw: dict[str, Any] = {"device": config.device, "enable_fusion": bool(config.enable_fusion),
                          "enable_memory_reuse": bool(config.enable_memory_reuse)}
    for name, default in (("max_context", 0), ("kv_window", 0), ("kv_sinks", 4), ("budget_bytes", 0)):
        if getattr(config, name) != default:
            kw[name] = int(getattr(config, name))
    if config.n_threads:
        kw["n_threads"] = int(config.n_threads)
    if config.pin_layers >= 0:
        kw["pin_layers"] = int(config.pin_layers)
    if config.preset:
        kw["preset"] = config.preset
    for name in ("kv_positions", "kv_dtype"):      # NULL: the Session's default
        if getattr(config, name) is not None:
            kw[name] = getattr(config, name)
    try:
        SessionOptions.from_kwargs(kw)
    except (SessionError, PresetError) as exc:
        raise CapiError(Status.ERR_CONFIG, str(exc)) from None
    return kw


def option_warnings(config: SessionConfig, ir: bool) -> list[str]:
    """C options this runtime does not honour as such; CONFIG errors for those it cannot run with."""
    if config.compute_dtype != ComputeDType.F32:
        raise CapiError(Status.ERR_CONFIG, "compute_dtype F16 is not supported: the backends compute in f32 "
                                           "(weights keep their stored types)")
    notes = []
    if not config.keep_quantized_weights:
        notes.append("keep_quantized_weights=0 has no effect: block-quantized weights stay packed")
    if config.enable_streaming and not config.budget_bytes and not config.preset:
        notes.append("enable_streaming=1 has no effect without budget_bytes (or a preset with a budget): weights "
                     "are memory-mapped; under a budget they stream")
    if config.profile_trace_path and not config.enable_profiler:
        notes.append("profile_trace_path is set but enable_profiler is 0: no trace will be written")
    if config.weights_dir and not ir:
        notes.append("weights_dir is ignored: this model's weights are inside the model files")
    return notes


class CapiSession:
    """See the module docstring. Every public method may raise; the C layer turns that into a status."""

    def __init__(self, path: str, config: SessionConfig) -> None:
        self.path = path
        self.config = config
        self.warnings: list[str] = []
        self.stats = GenerationStats()
        self.profiler = Profiler(bool(config.enable_profiler))
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._feeds: dict[str, np.ndarray] = {}
        self._outputs: dict[str, np.ndarray] = {}
        self._session: Any = None
        self._resolved: ResolvedWeights | None = None
        self._weight_store: Any = None
        ir = is_ir_path(path)
        self.warnings += option_warnings(config, ir)
        if not os.path.exists(path):
            raise CapiError(Status.ERR_NOT_FOUND, f"model {path!r}: no such file or directory")
        with self.profiler.span("create", path=path), _captured_warnings(self.warnings):
            if ir:
                self._graph = self._open_ir(Path(path))
            else:
                self._graph = self._open_model(path)

    def _open_ir(self, path: Path) -> Graph:
        from uaii.ir import load
        from uaii.runtime import Session, ir_bundle

        graph = load(path)
        options = session_options(self.config)
        self._resolved = resolved = resolve_weights(graph, path, self.config)
        self.warnings += resolved.warnings
        try:
            if resolved.session_compatible:
                self._session = Session(str(path), **options)
            else:  # the Session reads the weights where the options put them, not beside the file
                self._session = Session(ir_bundle(path, graph, resolved.locations), **options)
        except BaseException:
            resolved.close()
            raise
        return graph

    def _open_model(self, path: str) -> Graph:
        from uaii.runtime import Session

        if self.config.weights_sandbox:
            WeightRef(os.path.basename(path.rstrip("/")) or ".").resolve(os.path.dirname(os.path.abspath(path)),
                                                                         self.config.weights_sandbox)
        self._session = Session(path, **session_options(self.config))
        graph: Graph = self._session.graph
        return graph

    # ---- named tensors -------------------------------------------------------------------------------------
    def _tensor(self, name: str) -> Tensor:
        t = self._graph.tensor_map.get(name)
        if t is None:
            raise CapiError(Status.ERR_NOT_FOUND, f"the graph has no tensor {name!r} (inputs: "
                                                  f"{', '.join(self._graph.inputs)})")
        return t

    @_exclusive
    def set_f32(self, name: str, values: np.ndarray) -> None:
        t = self._tensor(name)
        if name not in self._graph.inputs:
            raise invalid(f"{name!r} is {'a weight' if t.is_weight else 'not a graph input'}; only inputs "
                          f"({', '.join(self._graph.inputs)}) can be set")
        self._feeds[name] = _as_input(t, values)

    @_exclusive
    def get_f32(self, name: str) -> np.ndarray:
        value = self._outputs.get(name)
        if value is None:
            value = self._feeds.get(name)
        if value is None:
            t = self._tensor(name)
            if t.is_weight:
                value = self._weight(t)
            elif name in self._graph.outputs:
                raise CapiError(Status.ERR_NOT_FOUND, f"output {name!r} has no value yet: call uaii_session_run")
            else:
                raise CapiError(Status.ERR_NOT_FOUND, f"{name!r} is neither a set input, an output of the last "
                                                      "run nor a weight")
        return _as_f32(name, value)

    def _weight(self, t: Tensor) -> np.ndarray:
        from uaii.backends import weight_key

        if t.is_constant:
            return t.numpy()
        if self._resolved is None:
            raise CapiError(Status.ERR_NOT_FOUND, f"weight {t.name!r} of a {self._kind()} model is not readable "
                                                  "through the C API (only IR graphs' weights are)")
        if self._weight_store is None:
            from uaii.storage import MmapStore

            self._weight_store = MmapStore(self._resolved.locations)
        raw = np.asarray(self._weight_store.acquire(weight_key(t)))
        if t.dtype.is_quantized:
            raise CapiError(Status.ERR_NOT_IMPLEMENTED, f"weight {t.name!r} is block-quantized "
                                                        f"({t.dtype.value}); it has no f32 view")
        return raw.reshape(-1).view(t.dtype.numpy) if raw.dtype == np.uint8 else raw

    def _kind(self) -> str:
        return "IR" if is_ir_path(self.path) else "loader"

    @_exclusive
    def run(self) -> None:
        with self.profiler.span("run", inputs=len(self._feeds)):
            outputs = self._session.run(self._feeds)
        self._outputs = outputs

    # ---- tokens and generation -----------------------------------------------------------------------------
    def _generative_session(self, what: str) -> Any:
        if self._session is None or not self._session.generative:
            raise CapiError(Status.ERR_NOT_IMPLEMENTED, f"cannot {what}: {os.path.basename(self.path)} is not a "
                                                        "language model (use uaii_session_run)")
        return self._session

    def _tokenizer(self, what: str) -> Any:
        tok = getattr(self._session, "tokenizer", None)
        if tok is None:
            raise CapiError(Status.ERR_NOT_IMPLEMENTED, f"cannot {what}: {os.path.basename(self.path)} has no "
                                                        "tokenizer")
        return tok

    @_exclusive
    def generate(self, prompt: list[int], config: GenerateConfig,
                 on_token: generation.OnToken | None = None) -> list[int]:
        session = self._generative_session("generate")
        with self.profiler.span("generate", "generation", prompt_tokens=len(prompt)) as args:
            start = self.profiler.now_ns()
            tokens, stats = generation.generate(session, prompt, config, on_token)
            args.update(new_tokens=stats.generated_tokens, finish_reason=int(stats.finish_reason))
        self.stats = stats
        prefill_ns = int(stats.prefill_seconds * 1e9)
        self.profiler.add("prefill", "generation", start, prefill_ns, tokens=stats.prompt_tokens)
        self.profiler.add("decode", "generation", start + prefill_ns, int(stats.decode_seconds * 1e9),
                          tokens=stats.generated_tokens)
        return tokens

    @_exclusive
    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        tok = self._tokenizer("tokenize")
        return [int(i) for i in tok.encode(text, add_special=add_special, parse_special=parse_special)]

    @_exclusive
    def detokenize(self, ids: list[int]) -> str:
        vocab = int(self._tokenizer("detokenize").vocab_size)
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise invalid(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        return str(self._session.detokenize(ids))

    @_exclusive
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        tok = self._tokenizer("apply a chat template")
        if getattr(tok, "chat_template", None) is None:
            raise CapiError(Status.ERR_NOT_IMPLEMENTED, f"{os.path.basename(self.path)} has no chat template")
        return str(tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))

    # ---- profile and lifetime ------------------------------------------------------------------------------
    def _profiler(self) -> Profiler:
        if not self.profiler.enabled:
            raise CapiError(Status.ERR_CONFIG, "the profiler is off: create the session with enable_profiler = 1")
        return self.profiler

    @_exclusive
    def profile_summary(self) -> str:
        return self._profiler().summary()

    @_exclusive
    def write_trace(self, path: str) -> None:
        self._write_trace(self._profiler(), path)

    @staticmethod
    def _write_trace(profiler: Profiler, path: str) -> None:
        try:
            profiler.write_trace(path)
        except OSError as exc:  # a missing directory is a failed write here, not a missing model
            raise CapiError(Status.ERR_IO, f"cannot write the trace to {path!r}: {exc.strerror or exc}") from None

    @_exclusive
    def close(self) -> None:
        """Release everything; then write the trace when profile_trace_path asks for one."""
        for obj in (self._session, self._weight_store, self._resolved):
            if obj is not None:
                obj.close()
        self._session = self._weight_store = self._resolved = None
        if self.profiler.enabled and self.config.profile_trace_path:
            self._write_trace(self.profiler, self.config.profile_trace_path)


def _as_input(t: Tensor, values: np.ndarray) -> np.ndarray:
    """The caller's flat floats shaped (one symbolic dim is inferred) and typed as the input."""
    n = values.size
    dims = list(t.shape)
    symbolic = [i for i, d in enumerate(dims) if isinstance(d, str)]
    known = math.prod(int(d) for d in dims if not isinstance(d, str))
    if len(symbolic) > 1:
        raise invalid(f"input {t.name!r} has shape {dims} with {len(symbolic)} symbolic dims; only one can be "
                      "inferred from n")
    if symbolic:
        if known == 0 or n % known:
            raise invalid(f"n = {n} does not fit input {t.name!r} of shape {dims}")
        dims[symbolic[0]] = n // known
    elif n != known:
        raise invalid(f"n = {n} but input {t.name!r} of shape {[int(d) for d in dims]} has {known} elements")
    if t.dtype.is_quantized:
        raise invalid(f"input {t.name!r} is block-quantized ({t.dtype.value}); it cannot be set from floats")
    shaped = values.reshape([int(d) for d in dims])
    if t.dtype.value == "bf16":
        from uaii.ir.reference import f32_to_bf16

        return np.asarray(f32_to_bf16(shaped))
    return shaped.astype(t.dtype.numpy)


def _as_f32(name: str, value: np.ndarray) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == np.uint16:  # bf16 words
        from uaii.ir.reference import bf16_to_f32

        arr = bf16_to_f32(arr)
    if arr.dtype.kind not in "fiub":
        raise invalid(f"tensor {name!r} of dtype {arr.dtype} has no f32 view")
    return np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
