"""The SSE stream of `uaii serve` parsed by hand with httpx: ``data: {json}`` frames, ``data: [DONE]`` last, usage
null on every chunk but the usage chunk; and a client that leaves frees its sequence at once (stream or not)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import serving  # noqa: E402

from uaii.runtime.serve import ServerState  # noqa: E402
from uaii.runtime.serve.sse import SseResponse  # noqa: E402

LONG = {"max_tokens": 240, "ignore_eos": True, "temperature": 0}  # runs for seconds unless cancelled


@pytest.fixture(scope="module")
def served(smollm2_path: Path) -> Iterator[tuple[str, ServerState]]:
    state = ServerState(smollm2_path, session_options={"max_context": 256})
    with serving(state) as url:
        yield url, state


def frames(response: Any) -> list[str]:
    """The data of each SSE event (``data:`` lines; events separated by a blank line)."""
    out, data = [], []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line == "" and data:
            out.append("\n".join(data))
            data = []
        else:
            assert line.startswith(":") or line == "", f"unexpected SSE line {line!r}"  # comments: pings
    if data:
        out.append("\n".join(data))
    return out


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/completions", {"prompt": "Once upon a time"}),
])
def test_frames_done_and_usage(served: tuple[str, ServerState], route: str, body: dict[str, Any]) -> None:
    url, _ = served
    req = {**body, "max_tokens": 5, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + route, json=req, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = frames(r)
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    chunks = [json.loads(d) for d in data[:-1]]
    *body_chunks, usage_chunk = chunks
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    assert all("usage" in c and c["usage"] is None for c in body_chunks)
    finish = [c["choices"][0]["finish_reason"] for c in body_chunks]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert len({c["id"] for c in chunks}) == 1


def test_no_usage_chunk_without_include_usage(served: tuple[str, ServerState]) -> None:
    url, _ = served
    req = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=req, timeout=60) as r:
        data = frames(r)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]" and all(c["choices"] for c in chunks)


def _active(state: ServerState) -> int:
    assert state.loaded is not None
    return int(state.loaded.engine.stats()["requests_active"])


def _wait_idle(state: ServerState, within_s: float) -> float:
    t0 = time.monotonic()
    while _active(state) and time.monotonic() - t0 < within_s:
        time.sleep(0.01)
    return time.monotonic() - t0


def test_client_leaving_a_stream_frees_its_sequence(served: tuple[str, ServerState]) -> None:
    url, state = served
    req = {"prompt": "Count: 1, 2, 3,", "stream": True, **LONG}
    with httpx.stream("POST", url + "/v1/completions", json=req, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]  # two frames in: the request decodes
        assert any(line.startswith("data:") for line in got)
        assert _active(state) == 1
    waited = _wait_idle(state, 5.0)  # leaving the block closed the connection
    assert _active(state) == 0 and waited < 1.0, f"the sequence was still active {waited:.2f} s after the client left"
    stats = state.loaded.engine.stats()
    assert stats["completion_tokens_total"] < 240 and stats["requests_cancelled"] >= 1


def test_client_leaving_a_plain_request_frees_its_sequence(served: tuple[str, ServerState]) -> None:
    url, state = served
    assert state.loaded is not None
    before = state.loaded.engine.stats()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "/v1/completions", json={"prompt": "Count: 1, 2, 3,", **LONG}, timeout=0.5)
    waited = _wait_idle(state, 5.0)
    assert _active(state) == 0 and waited < 1.0, f"the sequence was still active {waited:.2f} s after the client left"
    after = state.loaded.engine.stats()
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1  # cancelled, not run to its end
    generated = after["completion_tokens_total"] - before["completion_tokens_total"]
    assert generated < LONG["max_tokens"], f"the request generated {generated} tokens after its client left"


def test_sigint_ends_a_stream_with_its_error_frame_and_the_server_exits(smollm2_path: Path) -> None:
    """`uaii serve` stopped (Ctrl-C) while a stream decodes: the engine ends the request at once, so the stream
    gets the ``model_unloaded`` error frame and ``[DONE]`` (no finish chunk pretends it ended), and the process
    exits well within uvicorn's graceful wait (5 s) instead of decoding on through it."""
    from serve_support import uaii_serve

    req = {"prompt": "Count: 1, 2, 3,", "stream": True, **LONG, "max_tokens": 2000}
    with uaii_serve(str(smollm2_path), "--max-context", "2048") as server:
        with httpx.stream("POST", server.url + "/v1/completions", json=req, timeout=60) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGINT)
            data = [first[6:], *frames_of(lines)]
        server.proc.wait(timeout=30)
        took = time.monotonic() - t0
    assert data[-1] == "[DONE]", data[-3:]
    assert json.loads(data[-2])["error"]["code"] == "model_unloaded", data[-2]
    assert all(json.loads(d)["choices"][0]["finish_reason"] is None for d in data[:-2])
    # uvicorn re-raises the signal it caught once it has shut down: the conventional 128 + SIGINT
    code = server.proc.returncode
    assert code in (0, 128 + signal.SIGINT, -signal.SIGINT) and took < 4.0, (code, took)


def frames_of(lines: Iterator[str]) -> list[str]:
    return [line[6:] for line in lines if line.startswith("data: ")]


# ------------------------------------------------------------------------------------------- the response alone
def _run_sse(frames: Any, disconnect_after: float | None = None, ping_s: float = 15.0) -> tuple[list[Any], list[str]]:
    """SseResponse driven by hand: the ASGI messages it sent, and what happened (disconnect callback, the frame
    generator's finally)."""
    sent: list[Any] = []
    happened: list[str] = []

    async def receive() -> dict[str, Any]:
        if disconnect_after is None:
            await asyncio.Event().wait()  # never: the client stays
        await asyncio.sleep(disconnect_after or 0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        response = SseResponse(frames(happened), on_disconnect=lambda: happened.append("disconnect"), ping_s=ping_s)
        await response({"type": "http", "method": "POST"}, receive, send)

    asyncio.run(main())
    return sent, happened


async def _slow_frames(happened: list[str], n: int = 3, gap: float = 0.0) -> Any:
    try:
        for i in range(n):
            await asyncio.sleep(gap)
            yield f"data: {i}\n\n".encode()
    finally:
        happened.append("closed")


def test_sse_response_sends_the_frames_as_given_and_ends_the_body() -> None:
    sent, happened = _run_sse(_slow_frames)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream") and headers[b"cache-control"] == b"no-store"
    assert [m["body"] for m in sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert [m["more_body"] for m in sent[1:]] == [True, True, True, False]
    assert happened == ["closed"]


def test_sse_response_pings_a_quiet_stream_and_never_after_its_end() -> None:
    sent, _ = _run_sse(lambda h: _slow_frames(h, n=2, gap=0.25), ping_s=0.1)
    bodies = [m["body"] for m in sent[1:]]
    assert b": ping\n\n" in bodies and bodies[-1] == b"" and sent[-1]["more_body"] is False
    assert bodies.index(b"data: 1\n\n") < len(bodies) - 1  # the end comes after every frame and ping


def test_sse_response_stops_at_a_disconnect_and_closes_the_frames() -> None:
    sent, happened = _run_sse(lambda h: _slow_frames(h, n=100, gap=0.02), disconnect_after=0.1)
    assert happened == ["disconnect", "closed"]
    assert 1 < len(sent) < 20 and all(m.get("more_body", True) for m in sent)  # no end of body after it
