"""Run the `uaii serve` app for a test: uvicorn in a thread on 127.0.0.1 and an ephemeral port.

    with running_server(model=path, session_options={"max_context": 256}) as url:
        httpx.get(f"{url}/health")

``running_server(**kwargs)`` builds a ``ServerState(**kwargs)``; ``serving(state)`` runs one the test made itself
(to look at ``state.loaded.engine`` while requests run). The server stops (and the state closes) on leaving.
``uaii_serve(*args)`` runs the real command in a subprocess (``--port 0``), for what needs a process of its own:
its RSS, its printed banner, a non-loopback bind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install 'uaii-runtime[serve]'")

import httpx
import uvicorn

from uaii.runtime.serve import ServerState, create_app

START_TIMEOUT_S = 30.0


@contextmanager
def serving(state: ServerState, *, log_level: str = "warning") -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT``) of ``state``'s app served by uvicorn in a daemon thread."""
    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=0, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            state.close()
            raise RuntimeError("the test server did not start (see the uvicorn log above)")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        state.close()  # also done by the app's lifespan; idempotent


@contextmanager
def running_server(**state_kwargs: Any) -> Iterator[str]:
    """The base URL of a server over ``ServerState(**state_kwargs)``."""
    with serving(ServerState(**state_kwargs)) as url:
        yield url


@dataclass
class ServeProcess:
    """A running ``uaii serve``: the process, the base URL to connect to, its stdout lines so far."""

    proc: subprocess.Popen[str]
    url: str
    stdout: list[str] = field(default_factory=list)

    def rss_bytes(self) -> int:
        """VmRSS of the server process now."""
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


@contextmanager
def uaii_serve(*args: str, env: dict[str, str] | None = None) -> Iterator[ServeProcess]:
    """``uaii serve ARGS --port 0`` in a subprocess, once its /health answers; stopped with SIGINT on leaving."""
    cmd = [sys.executable, "-m", "uaii.runtime.cli", "--no-color", "serve", *args, "--port", "0"]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                env={**os.environ, **(env or {})})
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()
        try:
            url = _wait_ready(proc, lines, err)
            yield ServeProcess(proc, url, lines)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_ready(proc: subprocess.Popen[str], lines: list[str], err: Any) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S * 2
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err.seek(0)
            raise RuntimeError(f"uaii serve exited with {proc.returncode}: {err.read()[-2000:]}")
        found = next((m for m in map(re.compile(r"uaii serve: (http://\S+?)/? ").search, list(lines)) if m), None)
        if found is not None:
            url = found.group(1).replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"uaii serve did not answer /health within {START_TIMEOUT_S * 2:.0f} s; stdout: {lines}")
