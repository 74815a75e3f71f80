"""Bad input to `uaii serve`: each mistake is a clear 4xx in OpenAI's error shape, and the server goes on serving.

The storm test runs the real ``uaii serve`` in a subprocess: 100 clients open connections and drop them (mid-stream,
mid-body, mid-headers, before the reply of a plain request), twice; the server answers a normal request after each
storm, and its resident memory after the second storm is within a stated bound of what it was after the first
(a warm-up: the first storm's allocations — thread pools, KV pages, arenas — are reused, not grown)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import ServeProcess, running_server, uaii_serve  # noqa: E402

from uaii.runtime.presets import MiB  # noqa: E402

CONTEXT = 256
CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
STORM_CLIENTS = 100
RSS_GROWTH_BOUND = 24 * MiB  # after the second storm vs after the first


@pytest.fixture(scope="module")
def url(smollm2_path: Path) -> Iterator[str]:
    with running_server(model=smollm2_path, session_options={"max_context": CONTEXT}) as base:
        yield base


def error_of(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text[:300]}"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"].startswith("[serve] ")
    return body["error"]


# (name, route, raw body, status, words the message must contain, param)
CASES = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400, ["not valid JSON"], None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, ["must be a JSON object"], None),
    ("no messages", "/v1/chat/completions", b"{}", 400, ["'messages' is required"], "messages"),
    ("content is a number", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 5}]}),
     400, ["messages.0.content", "string", "found 5"], "messages.0.content"),
    ("max_tokens is a string", "/v1/chat/completions", json.dumps({**CHAT, "max_tokens": "5"}), 400,
     ["'max_tokens'", "integer", "'5'"], "max_tokens"),
    ("stream is a number", "/v1/completions", json.dumps({"prompt": "x", "stream": 1}), 400, ["'stream'", "boolean"],
     "stream"),
    ("unknown role", "/v1/chat/completions", json.dumps({"messages": [{"role": "bot", "content": "x"}]}), 400,
     ["messages.0.role", "'bot'"], "messages.0.role"),
    ("negative max_tokens", "/v1/chat/completions", json.dumps({**CHAT, "max_tokens": -1}), 400,
     ["'max_tokens' must be >= 1", "-1"], "max_tokens"),
    ("zero max_completion_tokens", "/v1/chat/completions", json.dumps({**CHAT, "max_completion_tokens": 0}), 400,
     ["'max_completion_tokens' must be >= 1"], "max_completion_tokens"),
    ("huge max_tokens", "/v1/completions", json.dumps({"prompt": "hello", "max_tokens": 10**12}), 400,
     ["context is 256 tokens", str(10**12)], "max_tokens"),
    ("n=2", "/v1/chat/completions", json.dumps({**CHAT, "n": 2}), 400, ["only n=1"], "n"),
    ("five stops", "/v1/completions", json.dumps({"prompt": "x", "stop": list("abcde")}), 400, ["'stop'", "4"],
     "stop"),
    ("temperature too high", "/v1/completions", json.dumps({"prompt": "x", "temperature": 9}), 400,
     ["'temperature'", "2"], "temperature"),
    ("top_logprobs alone", "/v1/chat/completions", json.dumps({**CHAT, "top_logprobs": 2}), 400,
     ["needs 'logprobs'"], "top_logprobs"),
    ("two prompts", "/v1/completions", json.dumps({"prompt": ["a", "b"]}), 400, ["one prompt per request"],
     "prompt"),
    ("token id out of the vocabulary", "/v1/completions", json.dumps({"prompt": [1, 10**9]}), 400,
     ["outside the vocabulary"], "prompt"),
    ("unknown model", "/v1/chat/completions", json.dumps({**CHAT, "model": "gpt-4"}), 404,
     ["'gpt-4'", "does not exist"], "model"),
    ("tokenize without content", "/tokenize", b'{"add_special": true}', 400, ["'content' is required"], "content"),
]


@pytest.mark.parametrize("name, route, body, status, words, param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_is_a_clear_4xx(url: str, name: str, route: str, body: Any, status: int, words: list[str],
                                    param: str | None) -> None:
    r = httpx.post(url + route, content=body, headers={"content-type": "application/json"}, timeout=30)
    err = error_of(r, status)
    for word in words:
        assert word in err["message"], f"{name}: {word!r} not in {err['message']!r}"
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


def test_prompt_over_the_context_says_both_numbers(url: str) -> None:
    prompt = "word " * 400  # ~400 tokens > the 256 of the context
    err = error_of(httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8}, timeout=60), 400)
    assert err["code"] == "context_length_exceeded"
    assert "context is 256 tokens" in err["message"] and "max_tokens 8" in err["message"]


def test_unknown_fields_are_ignored(url: str) -> None:
    r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "max_tokens": 2, "frequency_penalty": 0,
                                                       "user": "x", "some_future_field": {"a": 1}}, timeout=60)
    assert r.status_code == 200, r.text


def test_routes_and_methods(url: str) -> None:
    assert error_of(httpx.get(url + "/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(httpx.get(url + "/v1/chat/completions"), 405)["code"] == "method_not_allowed"


def test_ten_megabyte_prompt_is_refused_unread(url: str) -> None:
    big = json.dumps({"prompt": "x" * (10 << 20), "max_tokens": 1}).encode()
    declared = httpx.post(url + "/v1/completions", content=big, headers={"content-type": "application/json"},
                          timeout=60)
    assert "4194304 bytes" in error_of(declared, 413)["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once the bytes read pass the limit
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]

    chunked = httpx.post(url + "/v1/completions", content=chunks(), timeout=60)
    assert error_of(chunked, 413)["code"] == "request_too_large"
    assert httpx.post(url + "/v1/completions", json={"prompt": "ok", "max_tokens": 1}, timeout=60).status_code == 200


# -------------------------------------------------------------------------------------------------- the storm
async def _drop_mid_stream(client: Any, i: int) -> None:
    body = {"prompt": f"Client {i} counts: 1, 2,", "max_tokens": 64, "ignore_eos": True, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                return  # leaving closes the connection mid-stream


async def _drop_before_reply(client: Any, i: int) -> None:
    with contextlib.suppress(httpx.TimeoutException):
        await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 64, "ignore_eos": True}, timeout=0.2)


async def _drop_mid_request(host: str, port: int, i: int) -> None:
    """Raw TCP: half the headers, or the headers and part of a declared body, then gone."""
    _, writer = await asyncio.open_connection(host, port)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    writer.write((head + "Content-Length: 1000\r\n\r\n{\"prompt\": \"" if i % 2 else head[:30]).encode())
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    await writer.wait_closed()


async def _storm(base: str) -> None:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    limits = httpx.Limits(max_connections=STORM_CLIENTS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        jobs = []
        for i in range(STORM_CLIENTS):
            kind = i % 4
            if kind in (0, 1):
                jobs.append(_drop_mid_stream(client, i))
            elif kind == 2:
                jobs.append(_drop_before_reply(client, i))
            else:
                jobs.append(_drop_mid_request(host, int(port), i))
        results = await asyncio.gather(*jobs, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} storm clients failed, e.g. {failures[0]!r}"


def _settle(server: ServeProcess) -> int:
    """Wait for the engine to be idle, then the server's RSS."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page = httpx.get(server.url + "/metrics", timeout=10).text
        active = next(float(line.split()[1]) for line in page.splitlines() if line.startswith("uaii_sequences_active "))
        queued = next(float(line.split()[1]) for line in page.splitlines() if line.startswith("uaii_sequences_queued "))
        if active == queued == 0:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the engine still had sequences 30 s after the storm")
    time.sleep(0.3)
    return server.rss_bytes()


def _normal_request(server: ServeProcess) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "max_tokens": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


def test_storms_of_dropped_clients_neither_stop_the_server_nor_grow_its_memory(smollm2_path: Path) -> None:
    with uaii_serve(str(smollm2_path), "--max-context", str(CONTEXT)) as server:
        _normal_request(server)
        asyncio.run(_storm(server.url))
        _normal_request(server)
        warm = _settle(server)
        asyncio.run(_storm(server.url))
        _normal_request(server)
        after = _settle(server)
        print(f"\nRSS after the warm-up storm {warm / MiB:.1f} MiB, after the second {after / MiB:.1f} MiB "
              f"(growth {(after - warm) / MiB:+.1f} MiB, bound {RSS_GROWTH_BOUND / MiB:.0f} MiB)")
        assert after - warm <= RSS_GROWTH_BOUND
        page = httpx.get(server.url + "/metrics", timeout=10).text
        assert 'route="/v1/completions",status="200"' in page
