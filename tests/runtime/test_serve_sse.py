"""The SSE stream of `uaii serve` parsed by hand with httpx: ``data: {json}`` frames, ``data: [DONE]`` last, usage
null on every chunk but the usage chunk; and a client that leaves frees its sequence at once (stream or not)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import serving  # noqa: E402

from uaii.runtime.serve import ServerState  # noqa: E402

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
