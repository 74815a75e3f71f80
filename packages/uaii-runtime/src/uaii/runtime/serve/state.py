"""``ServerState``: what one server holds — the models it may load, the one loaded now (Session + Engine), the
options it loads them with, the API key, the limits and the request counters. ``request.app.state.uaii`` is it.

One model is loaded at a time. A request naming another model loads it (after unloading the current one) when no
request is in flight, else it is refused with 409 (the loaded model keeps serving); while a load runs, /health
says 503 and other loads are refused with 503. Loading is blocking (seconds): handlers call :meth:`ServerState.load`
through a worker thread, never on the event loop.

"In flight" is counted by leases: a request takes one (:meth:`ServerState.lease`, :meth:`ServerState.use_model`)
when it finds its model and gives it back when it ends — a stream when its SSE generator ends — so the model cannot
be closed under it between finding it, tokenizing its prompt and submitting it (a load or unload meanwhile is 409).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from uaii.ir import UaiiError
from uaii.runtime.presets import MiB, Preset

from .errors import ApiError, ServeError
from .metrics import Metrics
from .registry import ModelEntry, ModelRegistry

log = logging.getLogger("uaii.serve")

DEFAULT_MAX_BODY = 4 * MiB
DEFAULT_MAX_SEQUENCES = 8


@dataclass(frozen=True)
class Limits:
    """What one request may ask: body bytes, max_tokens (None: up to the context), sequences decoded at once."""

    max_body: int = DEFAULT_MAX_BODY
    max_tokens: int | None = None
    max_sequences: int = DEFAULT_MAX_SEQUENCES

    def __post_init__(self) -> None:
        for name, lo in (("max_body", 1), ("max_sequences", 1)):
            if getattr(self, name) < lo:
                raise ServeError(f"{name} must be >= {lo}, found {getattr(self, name)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ServeError(f"max_tokens limit must be >= 1, found {self.max_tokens}")


@dataclass
class LoadedModel:
    """The model serving now: its registry entry, its Session and the Engine that batches its requests. An
    encoder (a model that does not generate, such as BERT: only /v1/embeddings applies) has no engine: ``engine``
    is None and :meth:`stats` is empty."""

    entry: ModelEntry
    session: Any
    engine: Any | None
    created: int = field(default_factory=lambda: int(time.time()))
    load_s: float = 0.0
    leases: int = 0  # requests holding the model (Lease); changed under the ServerState's lock

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def generative(self) -> bool:
        """Whether the model generates (it has an engine): chat and completions apply to it."""
        return self.engine is not None

    def stats(self) -> dict[str, Any]:
        """The engine's figures (:meth:`Engine.stats`); empty for an encoder, which has no engine."""
        return dict(self.engine.stats()) if self.engine is not None else {}

    def busy(self) -> bool:
        """Whether requests are in flight: leases held (every route that uses the model takes one, embeddings and
        the bench included), or requests in the engine (one submitted to it directly)."""
        if self.leases:
            return True
        stats = self.stats()
        return bool(stats.get("requests_active", 0) or stats.get("requests_queued", 0))

    def close(self) -> None:
        try:
            if self.engine is not None:
                self.engine.close()
        finally:
            self.session.close()


class Lease:
    """One request's hold on the loaded model (see the module docstring): ``model`` stays open until
    :meth:`release`, which is idempotent (a stream may end by several paths) and also runs on leaving a ``with``."""

    def __init__(self, lock: threading.Lock, model: LoadedModel) -> None:
        self._lock = lock
        self.model = model
        self._held = True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self.model.leases -= 1

    def __enter__(self) -> LoadedModel:
        return self.model

    def __exit__(self, *exc: object) -> None:
        self.release()


def default_engine_factory(session: Any, max_sequences: int) -> Any:
    from uaii.runtime.engine import Engine

    return Engine(session, max_sequences=max_sequences)


def default_session_factory(path: str, **options: Any) -> Any:
    from uaii.runtime import Session

    return Session(path, **options)


class ServerState:
    """See the module docstring. ``model`` (a file or directory: a registry of one) or ``models_dir`` (every model
    in it). ``preload``: True loads ``model`` (or the models directory's only model) now, a name loads that one,
    False none (the first request naming a model loads it)."""

    def __init__(self, model: str | Path | None = None, *, models_dir: str | Path | None = None,
                 session_options: dict[str, Any] | None = None, preset: Preset | None = None,
                 api_key: str | None = None, limits: Limits | None = None, cors_origins: tuple[str, ...] = (),
                 preload: bool | str = True, session_factory: Callable[..., Any] | None = None,
                 engine_factory: Callable[[Any, int], Any] | None = None) -> None:
        if (model is None) == (models_dir is None):
            raise ServeError("give a model (a file or directory) or a models directory, not both and not neither")
        self.registry = (ModelRegistry.of_model(model) if model is not None
                         else ModelRegistry.of_directory(models_dir))  # type: ignore[arg-type]
        self.session_options = dict(session_options or {})
        self.preset = preset
        self.api_key = api_key or None
        self.limits = limits or Limits()
        self.cors_origins = tuple(cors_origins)
        self.metrics = Metrics()
        self.started = time.time()
        self._session_factory = session_factory or default_session_factory
        self._engine_factory = engine_factory or default_engine_factory
        self._lock = threading.Lock()  # guards loaded/loading; held only to check and swap, never while loading
        self.loaded: LoadedModel | None = None
        self.loading: str | None = None  # the name being loaded
        first = preload is True and (model is not None or len(self.registry) == 1)
        name = preload if isinstance(preload, str) else (self.registry.names[0] if first else None)
        if name is not None:
            self.load(name)

    # --- loading -------------------------------------------------------------------------------------------
    def load(self, name: str) -> LoadedModel:
        """The model ``name`` loaded (unloading another one first); 404 unknown, 409 others' requests in flight,
        503 another load under way. Blocking: call it from a worker thread in async code."""
        return self._load(name, lease=False)

    def _load(self, name: str, *, lease: bool) -> LoadedModel:
        """:meth:`load`; with ``lease`` the model's lease count is raised in the same critical section that finds
        or installs it, so no other request can unload it in between (the caller wraps it in a :class:`Lease`)."""
        entry = self.registry.get(name)
        with self._lock:
            current = self.loaded
            if current is not None and current.name == entry.name:
                current.leases += int(lease)
                return current
            if self.loading is not None:
                raise ApiError(503, f"the model {self.loading!r} is loading; retry when GET /health says ok",
                               code="model_loading")
            if current is not None and current.busy():
                raise ApiError(409, f"the model {current.name!r} is serving requests; {entry.name!r} can load once "
                                    "they finish (one model is loaded at a time)", code="model_busy", param="model")
            self.loading, self.loaded = entry.name, None
        try:
            if current is not None:
                current.close()
            loaded = self._open(entry)
        except UaiiError as exc:
            raise ApiError(500, f"cannot load the model {entry.name!r}: {exc}", code="model_load_failed") from exc
        finally:
            with self._lock:
                self.loading = None
        with self._lock:
            self.loaded = loaded
            loaded.leases += int(lease)
        return loaded

    def _open(self, entry: ModelEntry) -> LoadedModel:
        t0 = time.perf_counter()
        # a budget keeps room for the KV states of the engine's sequences (SessionOptions.sequences)
        options = {"sequences": self.limits.max_sequences, **self.session_options}
        session = self._session_factory(str(entry.path), **options)
        try:  # an encoder gets no engine (the Engine generates, and refuses one): it serves /v1/embeddings only
            engine = (self._engine_factory(session, self.limits.max_sequences)
                      if getattr(session, "generative", True) else None)
        except BaseException:
            session.close()
            raise
        log.info("[serve] loaded %s in %.1f s", entry.name, time.perf_counter() - t0)
        return LoadedModel(entry, session, engine, load_s=time.perf_counter() - t0)

    def unload(self) -> str | None:
        """Unload the current model (409 while it serves requests); returns its name, None when none was loaded."""
        with self._lock:
            current = self.loaded
            if current is None:
                return None
            if current.busy():
                raise ApiError(409, f"the model {current.name!r} is serving requests; unload it once they finish",
                               code="model_busy")
            self.loaded = None
        current.close()
        return current.name

    def lease(self, name: object) -> Lease:
        """A lease on the model a request for ``name`` runs on: the current one when it has that name (or the
        request names none), else ``name`` loaded now (see :meth:`load`). Blocking when it loads. The model stays
        open until the lease is released; release it when the request ends (``with`` does)."""
        if name is None or name == "":
            with self._lock:
                current = self.loaded
                if current is None and self.loading is not None:
                    raise ApiError(503, f"the model {self.loading!r} is loading; retry when GET /health says ok",
                                   code="model_loading")
                if current is None:
                    raise ApiError(400, "no model is loaded; name one in the request's 'model' field "
                                        f"({', '.join(self.registry.names)})", code="model_not_loaded",
                                   param="model")
                current.leases += 1
            return Lease(self._lock, current)
        return Lease(self._lock, self._load(self.registry.get(name).name, lease=True))

    @asynccontextmanager
    async def use_model(self, name: object) -> AsyncIterator[LoadedModel]:
        """:meth:`lease` for async handlers: found (or loaded) in a worker thread, released on leaving."""
        lease = await anyio.to_thread.run_sync(self.lease, name)
        try:
            yield lease.model
        finally:
            lease.release()

    def health(self) -> str:
        """``ok`` (serving or ready to load), ``loading``."""
        return "loading" if self.loading is not None else "ok"

    def close(self) -> None:
        with self._lock:
            current, self.loaded = self.loaded, None
        if current is not None:
            current.close()


__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_SEQUENCES", "Lease", "Limits", "LoadedModel", "ServerState"]
