"""``SseResponse``: a Server-Sent Events stream of ready-made frames, with as little work per frame as ASGI allows.

Why not sse-starlette's EventSourceResponse: a streamed token is one frame, and on the two cores that also decode
every microsecond of the event loop's is taken from the decode. That response re-encodes each frame
(``ServerSentEvent``), wraps each send in an anyio cancel scope (which looks up the running task and the async
library every time) and keeps an exit-signal watcher task per stream: ~35 % of the event loop's time per token in
a 4-client ``make bench-serve`` (py-spy). Here a frame is ``data: <json>\\n\\n`` built by the caller, and its send is
one ASGI message; the work per stream (a task that waits for the client's disconnect, one that sends a keep-alive
comment after ``ping_s`` seconds of silence) is paid once, not per frame.

A client that disconnects: ``on_disconnect`` runs (the request is cancelled at once), the frame generator is closed
(its ``finally`` runs) and nothing more is sent. The server stopping ends streams through their generators (the
engine ends the requests; ``uaii serve`` closes the model on the first exit signal), not by cutting them here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

PING_S = 15.0  # a comment line after this many seconds without a frame keeps proxies from closing the stream


def frame(data: str) -> bytes:
    """One SSE event whose data is ``data`` (a single line: JSON never holds a raw newline)."""
    return b"data: " + data.encode("utf-8") + b"\n\n"


class SseResponse(Response):
    """``frames`` (bytes, each a whole event) as ``text/event-stream``; see the module docstring."""

    media_type = "text/event-stream"

    def __init__(self, frames: AsyncIterator[bytes], on_disconnect: Callable[[], None] | None = None,
                 ping_s: float = PING_S) -> None:
        self.frames = frames
        self.on_disconnect = on_disconnect
        self.ping_s = ping_s
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"})
        self._quiet = True  # no frame since the last ping check
        self._ended = False
        self._lock = anyio.Lock()  # a ping and the final message never cross

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, receive, tg.cancel_scope)
            if self.ping_s > 0:
                tg.start_soon(self._ping, send)
            try:
                await self._stream(send)
            finally:
                tg.cancel_scope.cancel()  # the watcher and the pinger; the stream itself has ended
                with anyio.CancelScope(shield=True):
                    await _close(self.frames)

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for data in self.frames:
            self._quiet = False
            await send({"type": "http.response.body", "body": data, "more_body": True})
        async with self._lock:
            self._ended = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self.on_disconnect is not None:
                    self.on_disconnect()
                scope.cancel()
                return

    async def _ping(self, send: Send) -> None:
        while True:
            await anyio.sleep(self.ping_s)
            async with self._lock:
                if self._ended:
                    return
                if self._quiet:
                    await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                self._quiet = True


async def _close(frames: AsyncIterator[bytes]) -> None:
    aclose = getattr(frames, "aclose", None)
    if aclose is not None:
        await aclose()


__all__ = ["PING_S", "SseResponse", "frame"]
