"""``uaii serve``: the OpenAI-compatible server (and the dashboard) over one model or a models directory.

The server code is uaii.runtime.serve, behind the ``serve`` extra; this module imports it only when the command
runs, so ``uaii --help`` stays fast and, without the extra, ``uaii serve`` is one error line that names it.
The socket is bound here, before uvicorn starts, so that a port in use is a one-line error too and ``--port 0``
prints the port the system chose.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

from uaii.runtime import presets

from .context import CliError, Context, add_runtime_options, model_path, runtime_options

EXTRA_HINT = "pip install 'uaii-runtime[serve]'"
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
    ap.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace, ctx: Context) -> int:
    try:
        import uvicorn

        from uaii.runtime import serve
        from uaii.runtime.serve.auth import api_key_for, is_loopback
        from uaii.runtime.serve.state import Limits
    except ImportError as exc:
        raise CliError(f"uaii serve needs the serve extra ({exc.name or 'a dependency'} is not installed): "
                       f"{EXTRA_HINT}") from None
    model, models_dir = _models(args)
    preset, options = runtime_options(args)
    if args.max_context is not None:
        if args.max_context < 1:
            raise CliError(f"--max-context must be >= 1, found {args.max_context}")
        options["max_context"] = args.max_context
    limits = _limits(args, Limits)
    key, generated = api_key_for(args.host, args.api_key)
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


__all__ = ["add_parsers", "cmd_serve", "memory_lines"]
