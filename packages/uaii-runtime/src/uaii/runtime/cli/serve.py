"""``uaii serve``: the OpenAI-compatible server (and the dashboard) over one model or a models directory.

The server code is uaii.runtime.serve, behind the ``serve`` extra; this module imports it only when the command
runs, so ``uaii --help`` stays fast and, without the extra, ``uaii serve`` is one error line that names it.
The socket is bound here, before uvicorn starts, so that a port in use is a one-line error too and ``--port 0``
prints the port the system chose. With ``--ray`` the same app runs on Ray Serve replicas instead
(uaii.runtime.serve.ray_replicas, behind the ``ray`` extra): this process deploys them, says where they listen and
waits for Ctrl-C or SIGTERM, then takes the deployment down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from importlib import import_module
from pathlib import Path
from typing import Any

from uaii.runtime import presets
from uaii.runtime.ray_support import import_ray

from .context import CliError, Context, add_runtime_options, model_path, pipeline_options, runtime_options

EXTRA_HINT = "pip install 'uaii-runtime[serve]'"
RAY_HINT = "pip install 'uaii-runtime[serve,ray]'"
DEFAULT_PORT = 8080


def add_parsers(sub: Any) -> None:
    ap = sub.add_parser("serve", help="OpenAI-compatible HTTP server (and the dashboard at /)",
                        description="Serve MODEL (or every model of --models-dir) over HTTP: /v1/chat/completions, "
                                    "/v1/completions, /v1/models, /health, /metrics, /tokenize; see docs/serve.md. "
                                    f"Needs the serve extra: {EXTRA_HINT}.")
    ap.add_argument("model", nargs="?", metavar="MODEL",
                    help="a GGUF file, a Hugging Face model directory or an ONNX file")
    ap.add_argument("--models-dir", metavar="DIR", default=None,
                    help="serve the models of DIR (GGUF files, HF directories), loaded by name on request")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                    "only; any other address requires an API key, generated and printed when not given)")
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: any free)")
    ap.add_argument("--api-key", metavar="KEY", default=None,
                    help="require 'Authorization: Bearer KEY' on every route but /health and the dashboard's page")
    ap.add_argument("--max-sequences", type=int, default=8, metavar="N",
                    help="requests decoded together (one batched pass per step); more wait in a queue (8)")
    ap.add_argument("--max-body", metavar="BYTES", default="4MiB", help="largest request body (4MiB)")
    ap.add_argument("--max-tokens-limit", type=int, default=None, metavar="N",
                    help="largest max_tokens a request may ask (default: the context)")
    ap.add_argument("--max-context", type=int, default=None, metavar="N",
                    help="tokens one sequence may hold, prompt and reply (default: the model's context)")
    ap.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                    help="allow browser requests from ORIGIN (repeatable; default: no CORS headers)")
    add_runtime_options(ap)
    g = ap.add_argument_group("replicas on Ray (docs/serve.md#replicas-on-ray; the ray extra: " + RAY_HINT + ")")
    g.add_argument("--ray", action="store_true",
                   help="serve from Ray Serve replicas, each a process with its own model and memory budget, behind "
                        "Ray Serve's proxy on --host/--port (a local Ray cluster unless --ray-address)")
    g.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="replicas (default 1); each reserves --threads CPUs (default 1) and runs that many threads")
    g.add_argument("--autoscale", metavar="MIN:MAX", default=None,
                   help="instead of --replicas: between MIN and MAX replicas, added while requests queue (more "
                        "in flight per replica than --max-sequences), removed when idle")
    ap.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace, ctx: Context) -> int:
    scaling = _replica_args(args)
    try:
        import uvicorn

        from uaii.runtime import serve
        from uaii.runtime.serve.auth import api_key_for, is_loopback
        from uaii.runtime.serve.state import Limits
    except ImportError as exc:
        raise CliError(f"uaii serve needs the serve extra ({exc.name or 'a dependency'} is not installed): "
                       f"{EXTRA_HINT}") from None
    if scaling is not None:
        try:
            import_ray()  # first, with the uv-run hook off (uaii.runtime.ray_support)
            import_module("ray.serve")
        except ImportError as exc:
            raise CliError(f"uaii serve --ray needs the ray extra ({exc.name or 'ray'} is not installed): "
                           f"{RAY_HINT}") from None
    model, models_dir = _models(args)
    preset, options = runtime_options(args)
    if args.max_context is not None:
        if args.max_context < 1:
            raise CliError(f"--max-context must be >= 1, found {args.max_context}")
        options["max_context"] = args.max_context
    limits = _limits(args, Limits)
    key, generated = api_key_for(args.host, args.api_key)
    if scaling is not None:
        return _serve_on_ray(args, ctx, scaling, model, models_dir, preset, options, limits, key, generated)
    sock = _listen(args.host, args.port)
    try:
        with ctx.status("loading the model ..."):
            state = serve.ServerState(model, models_dir=models_dir, session_options=options, preset=preset,
                                      api_key=key, limits=limits, cors_origins=tuple(args.cors_origin),
                                      session_factory=ctx.session_factory)
        _announce(ctx, state, sock, key if (generated or not is_loopback(args.host)) else None, generated)
        from .app import debug_level  # (app imports this module)

        debug = debug_level() > 0
        loop, http = server_stack()
        config = uvicorn.Config(serve.create_app(state), log_level="info" if debug else "warning",
                                access_log=debug, lifespan="on", loop=loop, http=http,
                                timeout_graceful_shutdown=5)
        stopping_server(uvicorn, config, state).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def stopping_server(uvicorn: Any, config: Any, state: Any) -> Any:
    """uvicorn's Server that closes the served model on the first exit signal (Ctrl-C, SIGTERM): the engine ends
    every request at once, so a stream ends with its ``model_unloaded`` error frame and ``[DONE]`` and a plain
    request with a 503 (docs/serve.md), instead of decoding on through uvicorn's graceful wait and being cut. The
    close runs as an event-loop callback, not inside the signal handler (which may interrupt code holding a lock
    the engine's worker needs while close() joins it)."""

    class StoppingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first:
                with contextlib.suppress(RuntimeError):  # no loop running (not started yet): nothing to end
                    asyncio.get_running_loop().call_soon_threadsafe(state.close)

    return StoppingServer(config)


def server_stack() -> tuple[str, str]:
    """uvicorn's event loop and HTTP implementation: uvloop and httptools, which the serve extra installs (uvloop
    where it exists: not on Windows), else asyncio's own loop and h11. Named here rather than left to uvicorn's
    "auto": a streamed token cost the event loop ~0.25-0.29 ms of CPU with asyncio and h11, ~0.18-0.21 ms with
    these, on the same cores as the decode (docs/benchmarks.md, serving)."""
    try:
        import_module("uvloop")
        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    try:
        import_module("httptools")
        http = "httptools"
    except ImportError:
        http = "h11"
    return loop, http


def _replica_args(args: argparse.Namespace) -> tuple[int, tuple[int, int] | None] | None:
    """(replicas, autoscale MIN:MAX or None) with --ray, None without; the flags checked before anything loads."""
    pipeline_options(args, {})  # the cluster and pipeline flags too: a misused one is said before the model
    if not args.ray:
        for flag, value in (("--replicas", args.replicas), ("--autoscale", args.autoscale)):
            if value is not None:
                raise CliError(f"{flag} needs --ray (replicas run on a Ray cluster)")
        return None
    if getattr(args, "pipeline", None) is not None:  # each replica a pipeline of stage actors: not built
        raise CliError("--ray with --pipeline: replicas of a model split into stages are not supported; give "
                       "--ray (whole-model replicas) or --pipeline K (one model's layers on K nodes)")
    if args.replicas is not None and args.autoscale is not None:
        raise CliError("give --replicas N or --autoscale MIN:MAX, not both")
    if args.replicas is not None and args.replicas < 1:
        raise CliError(f"--replicas must be >= 1, found {args.replicas}")
    if args.autoscale is None:
        return args.replicas or 1, None
    lo, sep, hi = args.autoscale.partition(":")
    if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
        raise CliError(f"--autoscale expects MIN:MAX (two whole numbers, e.g. 1:4), found {args.autoscale!r}")
    if int(lo) < 1 or int(hi) < int(lo):
        raise CliError(f"--autoscale {args.autoscale}: needs 1 <= MIN <= MAX")
    return int(lo), (int(lo), int(hi))


def _serve_on_ray(args: argparse.Namespace, ctx: Context, scaling_args: tuple[int, tuple[int, int] | None],
                  model: Path | None, models_dir: Path | None, preset: presets.Preset, options: dict[str, Any],
                  limits: Any, key: str | None, generated: bool) -> int:
    """Deploy the app on Ray Serve replicas (ray_replicas.deploy), say where, serve until Ctrl-C or SIGTERM."""
    from uaii.runtime.serve import ray_replicas
    from uaii.runtime.serve.auth import is_loopback
    from uaii.runtime.serve.registry import ModelRegistry

    from .app import debug_level  # (app imports this module)

    debug = debug_level() > 0
    logging.getLogger("ray.serve").setLevel(logging.INFO if debug else logging.WARNING)  # Serve's own chatter
    scaling = ray_replicas.Scaling(*scaling_args)
    if args.budget is None:  # the auto preset is this machine's; --budget is each replica's as given
        preset, options = ray_replicas.share_preset(preset, options, scaling.most)
    spec = ray_replicas.ReplicaSpec(
        model=str(model.resolve()) if model is not None else None,  # replicas run elsewhere: absolute paths
        models_dir=str(models_dir.resolve()) if models_dir is not None else None,
        session_options=options, preset=preset, api_key=key, limits=limits, cors_origins=tuple(args.cors_origin))
    if model is not None:
        registry = ModelRegistry.of_model(model)
    else:
        assert models_dir is not None  # _models gives one of the two
        registry = ModelRegistry.of_directory(models_dir)
    with ctx.status("starting the replicas ..."):
        deployed = ray_replicas.deploy(spec, scaling, host=args.host, port=args.port, address=args.ray_address,
                                       debug=debug)
    try:
        _announce_ray(deployed, registry.names, key if (generated or not is_loopback(args.host)) else None,
                      generated, args.ray_address)
        wait_for_exit_signal()
    finally:
        with ctx.status("stopping the replicas ..."):
            deployed.close()
    return 0


def _announce_ray(deployed: Any, names: list[str], key: str | None, generated: bool, address: str | None) -> None:
    """The plain server's lines (where, which models, the key), and how the replicas run."""
    out = sys.stdout
    print(f"uaii serve: {deployed.url}/  (OpenAI API at /v1, dashboard at /)", file=out)
    scaling, spec = deployed.scaling, deployed.spec
    count = (f"{scaling.autoscale[0]} to {scaling.autoscale[1]} (autoscaled)" if scaling.autoscale is not None
             else str(scaling.replicas))
    where = f"the Ray cluster at {address}" if address else "a local Ray cluster"
    head = "" if deployed.head_is_local else " (the proxy listens on the head node)"
    print(f"replicas: {count} on {where}{head}, {spec.threads} thread{'s' * (spec.threads > 1)} each", file=out)
    print(f"models: {', '.join(names) or 'none'}", file=out)
    preset = spec.preset
    if preset is not None:
        budget = presets.format_bytes(preset.budget_bytes) if preset.budget_bytes else "unlimited"
        print(f"memory: preset {preset.name} (budget {budget} per replica, kv cache {preset.kv_dtype})", file=out)
    if key is not None:
        print(f"API key{' (generated)' if generated else ''}: {key}", file=out)
        print("  clients send it as 'Authorization: Bearer KEY' (OpenAI clients: api_key=KEY)", file=out)
    out.flush()


def wait_for_exit_signal() -> None:
    """Block until SIGINT (Ctrl-C) or SIGTERM, as the plain server runs until one: the replicas serve meanwhile."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _models(args: argparse.Namespace) -> tuple[Path | None, Path | None]:
    if (args.model is None) == (args.models_dir is None):
        raise CliError("uaii serve: give MODEL or --models-dir DIR (one of them)")
    if args.model is not None:
        return model_path(args.model), None
    d = Path(args.models_dir).expanduser()
    if not d.is_dir():
        raise CliError(f"--models-dir {args.models_dir}: not a directory")
    return None, d


def _limits(args: argparse.Namespace, limits_type: Any) -> Any:
    for flag, value in (("--max-sequences", args.max_sequences), ("--max-tokens-limit", args.max_tokens_limit)):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be >= 1, found {value}")
    max_body = presets.parse_bytes(args.max_body)
    if max_body < 1:
        raise CliError(f"--max-body must be at least 1 byte, found {args.max_body}")
    return limits_type(max_body=max_body, max_tokens=args.max_tokens_limit, max_sequences=args.max_sequences)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (uvicorn serves it), or a one-line error."""
    if not 0 <= port <= 65535:
        raise CliError(f"--port must be in 0..65535, found {port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _announce(ctx: Context, state: Any, sock: socket.socket, key: str | None, generated: bool) -> None:
    """The lines a user needs: where, which models, with what memory, and the key when it is needed."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    out = sys.stdout
    print(f"uaii serve: http://{shown}:{port}/  (OpenAI API at /v1, dashboard at /)", file=out)
    loaded = state.loaded.name if state.loaded is not None else None
    names = ", ".join(f"{n} (loaded)" if n == loaded else n for n in state.registry.names) or "none"
    print(f"models: {names}", file=out)
    for line in memory_lines(state):
        print(line, file=out)
    if key is not None:
        print(f"API key{' (generated)' if generated else ''}: {key}", file=out)
        print("  clients send it as 'Authorization: Bearer KEY' (OpenAI clients: api_key=KEY)", file=out)
    out.flush()


def memory_lines(state: Any) -> list[str]:
    """The preset's budget, and the loaded model's effective context (``--max-context`` or the model's) with the
    KV window only where it is smaller than the context (a window beyond the context bounds nothing)."""
    lines = []
    preset = state.preset
    if preset is not None:
        budget = presets.format_bytes(preset.budget_bytes) if preset.budget_bytes else "unlimited"
        lines.append(f"memory: preset {preset.name} (budget {budget}, kv cache {preset.kv_dtype})")
    session = state.loaded.session if state.loaded is not None else None
    if session is not None and getattr(session, "context", None):
        context = int(session.context)
        window = int(getattr(getattr(session, "options", None), "kv_window", 0) or 0)
        shown = f", kv window {window}" if 0 < window < context else ""
        lines.append(f"context: {context} tokens a sequence{shown}")
    return lines


__all__ = ["add_parsers", "cmd_serve", "memory_lines", "wait_for_exit_signal"]
