"""The dashboard: the page at ``/`` (static files shipped in this package: ``static/``) and the JSON it reads.

| route                              | what                                                                       |
|------------------------------------|----------------------------------------------------------------------------|
| ``GET /``, ``GET /static/*``       | the page (HTML, JS, CSS; no data in them, so no API key is asked for)     |
| ``GET /api/models``                | the models directory: architecture, size, quant mix, memory estimate      |
| ``GET /api/plan?model=&budget=``   | the memory plan at a what-if budget, without loading (plan_view.py)       |
| ``GET /api/telemetry``             | tok/s, bytes read per token, read GB/s vs the disk's, expert hits, RSS    |
| ``GET /api/devices``               | the ``uaii devices`` table                                                |
| ``POST /api/bench``                | the ``uaii bench`` figures of the loaded model (small sizes)              |
| ``POST /api/load``, ``/api/unload``| load a model by name / unload the loaded one (ServerState.load/unload)    |

Every handler that reads files, plans or runs the model does it in a worker thread (``run_in_threadpool``), never
on the event loop. Estimates use the server's session options and budget (the ``auto`` preset unless told).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from uaii.ir import UaiiError
from uaii.runtime.presets import MiB, PresetError, get_preset, parse_bytes

from . import plan_view
from .errors import ApiError
from .metrics import process_rss_bytes
from .registry import ModelEntry
from .state import ServerState

STATIC_DIR = Path(__file__).resolve().parent / "static"
DISK_PROBE_BYTES = 256 * MiB  # read at most this much of a model file to measure the disk
DISK_BLOCK = 8 * MiB
BENCH_DEFAULTS = {"prompt_tokens": 64, "gen_tokens": 32}
BENCH_MAX = 4096  # prompt + generated tokens one bench may ask for (it holds the model meanwhile)
ESTIMATES_KEPT = 256

_estimates: dict[tuple[Any, ...], dict[str, Any]] = {}
_disk: dict[tuple[str, int, int], dict[str, Any] | None] = {}
_devices: dict[str, Any] = {}
_lock = threading.Lock()


def _state(request: Request) -> ServerState:
    return request.app.state.uaii


def server_budget(state: ServerState) -> int:
    """The budget the server loads models with: ``budget_bytes`` of its session options, else its preset's."""
    opts = state.session_options
    if "budget_bytes" in opts:
        return int(opts["budget_bytes"])
    if state.preset is not None:
        return int(state.preset.budget_bytes)
    name = opts.get("preset")
    return int(get_preset(name).budget_bytes) if isinstance(name, str) else 0


def _preset_name(state: ServerState) -> str | None:
    return state.preset.name if state.preset is not None else state.session_options.get("preset")


# ----------------------------------------------------------------------------------------------- the page
async def index(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


# ------------------------------------------------------------------------------------------------- models
def _file_key(entry: ModelEntry) -> tuple[str, int, int]:
    st = entry.path.stat()
    return str(entry.path), st.st_mtime_ns, st.st_size


def _cached_plan(state: ServerState, entry: ModelEntry, budget: int, what: str) -> dict[str, Any]:
    """plan_view's answer (``what="plan"``) or the budget range (``"range"``), kept per file, options and budget."""
    key = (what, _file_key(entry), repr(sorted(state.session_options.items())), budget)
    with _lock:
        hit = _estimates.get(key)
    if hit is not None:
        return hit
    value = plan_view.plan_view(entry.path, state.session_options, budget) if what == "plan" \
        else plan_view.budget_range(entry.path, state.session_options)
    with _lock:
        if len(_estimates) >= ESTIMATES_KEPT:
            _estimates.clear()
        _estimates[key] = value
    return value


def model_row(state: ServerState, entry: ModelEntry, budget: int) -> dict[str, Any]:
    """One row of the models table: the registry's facts, the model's and its plan at ``budget``."""
    loaded = state.loaded
    row: dict[str, Any] = {"name": entry.name, "kind": entry.kind, "size_bytes": entry.size_bytes,
                           "loaded": loaded is not None and loaded.name == entry.name, "estimate": None,
                           "error": None}
    try:
        row.update(plan_view.model_facts(plan_view.bundle_of(entry.path)))
        row["estimate"] = _cached_plan(state, entry, budget, "plan")
        row["estimate"] = {k: v for k, v in row["estimate"].items() if k not in ("layers", "others")}
    except (UaiiError, OSError) as exc:  # one unreadable model does not hide the others
        row["error"] = str(exc)
    return row


async def api_models(request: Request) -> Response:
    state = _state(request)
    budget = server_budget(state)
    rows = await run_in_threadpool(lambda: [model_row(state, e, budget) for e in state.registry])
    loaded = state.loaded
    return JSONResponse({"models": rows, "budget_bytes": budget, "preset": _preset_name(state),
                         "loaded": loaded.name if loaded is not None else None, "loading": state.loading})


def _budget_param(raw: str | None, state: ServerState) -> int:
    if raw is None or raw == "":
        return server_budget(state)
    try:
        return parse_bytes(raw)
    except PresetError as exc:
        raise ApiError(400, f"[serve] budget: {exc} (0 = unlimited)", code="invalid_budget", param="budget") from None


def _entry_param(raw: str | None, state: ServerState) -> ModelEntry:
    if raw:
        return state.registry.get(raw)
    loaded = state.loaded
    if loaded is not None:
        return loaded.entry
    raise ApiError(400, "[serve] name the model: /api/plan?model=NAME (no model is loaded)", param="model")


async def api_plan(request: Request) -> Response:
    """The plan of ``model`` at ``budget`` bytes (a size such as ``256MiB``; 0 = unlimited; default: the server's),
    with the slider's range (the smallest plan, everything pinned)."""
    state = _state(request)
    entry = _entry_param(request.query_params.get("model"), state)
    budget = _budget_param(request.query_params.get("budget"), state)

    def work() -> dict[str, Any]:
        view = _cached_plan(state, entry, budget, "plan")
        return {"model": entry.name, **view, "range": _cached_plan(state, entry, 0, "range")}

    try:
        return JSONResponse(await run_in_threadpool(work))
    except UaiiError as exc:
        raise ApiError(400, f"[serve] cannot plan {entry.name}: {exc}", code="plan_failed") from None


# ---------------------------------------------------------------------------------------------- telemetry
def disk_speed(path: Path) -> dict[str, Any] | None:
    """The disk's sequential read speed under ``path``, measured once per file (None until measured: the first
    call starts the measurement in a thread). See :func:`measure_read`."""
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _lock:
        if key in _disk:
            return _disk[key]
        _disk[key] = None

    def run() -> None:
        try:
            result: dict[str, Any] | None = measure_read(path)
        except OSError as exc:
            result = {"gb_s": None, "method": f"could not read {path.name}: {exc}"}
        with _lock:
            _disk[key] = result

    threading.Thread(target=run, name="uaii-disk-probe", daemon=True).start()
    return None


def measure_read(path: Path, limit: int = DISK_PROBE_BYTES, block: int = DISK_BLOCK) -> dict[str, Any]:
    """GB/s (1e9 bytes/s) of one sequential read of the first ``limit`` bytes of ``path`` in ``block``-byte reads,
    bypassing the page cache: ``O_DIRECT`` into a page-aligned buffer, else (a file system without it) a plain read
    after ``posix_fadvise(DONTNEED)``, whose pages are dropped again afterwards (our reads are not free memory)."""
    size = min(path.stat().st_size, limit)
    try:
        fd, direct = os.open(path, os.O_RDONLY | os.O_DIRECT), True
    except (OSError, AttributeError):
        fd, direct = os.open(path, os.O_RDONLY), False
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    try:
        try:
            done, seconds = _timed_read(fd, buf, size, drop=not direct)
        except OSError:
            if not direct:
                raise
            os.close(fd)  # O_DIRECT opened but refused the read (alignment): measure without it
            fd, direct = os.open(path, os.O_RDONLY), False
            done, seconds = _timed_read(fd, buf, size, drop=True)
    finally:
        buf.close()
        os.close(fd)
    how = "O_DIRECT" if direct else "plain reads after posix_fadvise(DONTNEED)"
    return {"gb_s": done / seconds / 1e9 if seconds > 0 else None, "bytes": done, "seconds": seconds,
            "method": f"one sequential read of the first {done / 1e6:.0f} MB of {path.name} in "
                      f"{block >> 20} MiB blocks ({how}, the page cache bypassed), measured once per model file"}


def _timed_read(fd: int, buf: mmap.mmap, size: int, *, drop: bool) -> tuple[int, float]:
    fadvise = getattr(os, "posix_fadvise", None)
    if drop and fadvise is not None:
        fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
    done, t0 = 0, time.perf_counter()
    while done < size:
        n = os.preadv(fd, [buf], done)
        if n <= 0:
            break
        done += n
    seconds = time.perf_counter() - t0
    if drop and fadvise is not None:
        fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
    return min(done, size), seconds


TELEMETRY_KEYS = ("decode_tok_s", "bytes_read_per_token", "read_gb_s", "expert_cache_hits", "expert_cache_misses",
                  "requests_total", "requests_active", "requests_queued", "prompt_tokens_total",
                  "completion_tokens_total", "batch_size_histogram", "batched_decode", "max_sequences",
                  "storage_mode")


def telemetry(state: ServerState) -> dict[str, Any]:
    """One sample of the live figures (null where nothing is loaded or measured yet)."""
    loaded = state.loaded
    stats: dict[str, Any] = {}
    if loaded is not None:
        try:
            stats = loaded.stats()  # empty for an encoder (no engine)
        except UaiiError:  # closed between the check and the call: an unload raced us
            stats = {}
    out: dict[str, Any] = {k: stats.get(k) for k in TELEMETRY_KEYS}
    hits, misses = stats.get("expert_cache_hits") or 0, stats.get("expert_cache_misses") or 0
    out.update(time=time.time(), model=loaded.name if loaded is not None else None, loading=state.loading,
               rss_bytes=process_rss_bytes(), budget_bytes=server_budget(state),
               expert_hit_rate=hits / (hits + misses) if hits + misses else None,
               disk=disk_speed(loaded.entry.path) if loaded is not None and loaded.entry.path.is_file() else None)
    return out


async def api_telemetry(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(telemetry, _state(request)))


# ------------------------------------------------------------------------------------------ devices, bench
def devices() -> dict[str, Any]:
    """The ``uaii devices`` figures (backends, and the adapters of the backends that list them), probed once."""
    from uaii.runtime.cli.system import device_listings, device_rows

    with _lock:
        if "table" in _devices:
            return _devices["table"]
    table = {"backends": device_rows(),
             "adapters": {name: {"adapters": a, "reason": why} for name, (a, why) in device_listings().items()}}
    with _lock:
        _devices["table"] = table
    return table


async def api_devices(request: Request) -> Response:
    return JSONResponse(await run_in_threadpool(devices))


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        import json

        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"[serve] the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"[serve] the body must be a JSON object, found {type(body).__name__}")
    return body


def _bench_sizes(body: dict[str, Any], context: int) -> tuple[int, int]:
    sizes = []
    for name, default in BENCH_DEFAULTS.items():
        value = body.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ApiError(400, f"[serve] {name} must be an integer >= 1, found {value!r}", param=name)
        sizes.append(value)
    limit = min(context, BENCH_MAX) if context else BENCH_MAX
    if sum(sizes) > limit:
        raise ApiError(400, f"[serve] prompt_tokens + gen_tokens = {sum(sizes)} is more than the {limit} tokens a "
                            "bench may use here (the model's context, at most 4096)", param="prompt_tokens")
    return sizes[0], sizes[1]


async def api_bench(request: Request) -> Response:
    """``uaii bench`` on the loaded model: it runs on the session's own KV state under the session's guard, so the
    engine's decode steps wait for it (and it for them); it never runs beside one."""
    from uaii.runtime.cli.bench import run_bench

    state = _state(request)
    body = await _json_body(request)
    if state.loaded is None:
        raise ApiError(409, "[serve] no model is loaded; load one first (POST /api/load)", code="model_not_loaded")
    async with state.use_model(None) as loaded:  # leased: no load or unload closes it under the bench
        if not loaded.generative:
            raise ApiError(409, f"[serve] {loaded.name} does not generate (an encoder): uaii bench measures "
                                "generation", code="model_not_generative")
        prompt, gen = _bench_sizes(body, int(getattr(loaded.session, "context", 0) or 0))
        t0 = time.perf_counter()
        try:
            res = await run_in_threadpool(run_bench, loaded.session, prompt_tokens=prompt, gen_tokens=gen, warmup=1)
        except UaiiError as exc:
            raise ApiError(409, f"[serve] the bench of {loaded.name} failed: {exc}", code="bench_failed") from None
    return JSONResponse({"model": loaded.name, "wall_s": time.perf_counter() - t0, **res,
                         "device": getattr(getattr(loaded.session, "backend", None), "name", None)})


async def api_load(request: Request) -> Response:
    state = _state(request)
    name = (await _json_body(request)).get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "[serve] send {\"model\": NAME} (GET /api/models lists the names)", param="model")
    loaded = await run_in_threadpool(state.load, name)
    return JSONResponse({"loaded": loaded.name, "load_s": loaded.load_s})


async def api_unload(request: Request) -> Response:
    return JSONResponse({"unloaded": await run_in_threadpool(_state(request).unload)})


def dashboard_routes() -> list[BaseRoute]:
    """The page and its API (added to the server's ROUTES by app.build_routes)."""
    return [
        Route("/", index, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
        Route("/api/models", api_models, methods=["GET"]),
        Route("/api/plan", api_plan, methods=["GET"]),
        Route("/api/telemetry", api_telemetry, methods=["GET"]),
        Route("/api/devices", api_devices, methods=["GET"]),
        Route("/api/bench", api_bench, methods=["POST"]),
        Route("/api/load", api_load, methods=["POST"]),
        Route("/api/unload", api_unload, methods=["POST"]),
    ]


__all__ = ["STATIC_DIR", "dashboard_routes", "disk_speed", "measure_read", "server_budget", "telemetry"]
