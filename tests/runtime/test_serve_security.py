"""`uaii serve` security: loopback by default; any other bind address gets an API key (given or generated and
printed) checked on every route but /health and the dashboard's static shell; models load by name only — a name
with path parts is unknown (404) and no file outside the registry is touched; CORS only when asked; without the
serve extra the command is one error line naming it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")

from serve_support import running_server, uaii_serve  # noqa: E402

import uaii.runtime  # noqa: E402
from uaii.runtime.cli import main  # noqa: E402
from uaii.runtime.serve import ServerState  # noqa: E402
from uaii.runtime.serve.auth import (  # noqa: E402
    api_key_for,
    host_allowed,
    is_json,
    is_loopback,
    is_open,
    origin_allowed,
)

OPTIONS = {"max_context": 128}
KEY = "s3cret-key"
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
# (method, path, json body) of every route that holds data or costs work
GUARDED = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", CHAT),
           ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}), ("GET", "/metrics", None),
           ("POST", "/tokenize", {"content": "Hi"}), ("POST", "/detokenize", {"tokens": [1]})]


def call(url: str, method: str, path: str, body: Any, key: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {key}".encode()} if key is not None else {}
    return httpx.request(method, url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def keyed(smollm2_path: Path) -> Iterator[str]:
    with running_server(model=smollm2_path, session_options=OPTIONS, api_key=KEY) as url:
        yield url


@pytest.mark.parametrize("method, path, body", GUARDED, ids=[g[1] for g in GUARDED])
def test_key_is_required(keyed: str, method: str, path: str, body: Any) -> None:
    for key in (None, "wrong", KEY + "x", "ñ-not-ascii"):
        r = call(keyed, method, path, body, key)
        assert r.status_code == 401, (key, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    assert call(keyed, method, path, body, KEY).status_code == 200


def test_health_is_open(keyed: str) -> None:
    assert httpx.get(keyed + "/health").json()["status"] == "ok"
    assert is_open("/") and is_open("/static/app.js") and not is_open("/api/models") and not is_open("/v1/models")


def test_loopback_needs_no_key_and_other_addresses_do() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.20", "example.com"]))
    assert api_key_for("127.0.0.1", None) == (None, False)
    assert api_key_for("127.0.0.1", "k") == ("k", False)
    key, generated = api_key_for("0.0.0.0", None)
    assert generated and key is not None and len(key) >= 32 and api_key_for("0.0.0.0", None)[0] != key


def test_non_loopback_bind_generates_and_prints_a_key(smollm2_path: Path) -> None:
    with uaii_serve(str(smollm2_path), "--host", "0.0.0.0", "--max-context", "128") as server:
        line = next(line for line in server.stdout if line.startswith("API key (generated): "))
        key = line.split(": ", 1)[1].strip()
        assert call(server.url, "GET", "/v1/models", None).status_code == 401
        assert call(server.url, "GET", "/metrics", None, "nope").status_code == 401
        assert call(server.url, "GET", "/v1/models", None, key).status_code == 200
        assert httpx.get(server.url + "/health").status_code == 200


def test_loopback_bind_prints_no_key(smollm2_path: Path) -> None:
    with uaii_serve(str(smollm2_path), "--max-context", "128") as server:
        assert not any("API key" in line for line in server.stdout)
        assert "context: 128 tokens a sequence\n" in server.stdout  # the window (2048) bounds nothing here
        assert not any("kv window" in line for line in server.stdout)
        assert any(line.startswith(f"models: {smollm2_path.stem} (loaded)") for line in server.stdout)
        assert call(server.url, "GET", "/v1/models", None).status_code == 200


# ------------------------------------------------------------------------------------------- names, not paths
TOUCHED: list[str] = []
_WATCHING: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHING and event in {"open", "os.listdir", "os.scandir"} and args and isinstance(args[0], str | bytes):
        path = args[0].decode(errors="replace") if isinstance(args[0], bytes) else args[0]
        if _WATCHING[0] in path:
            TOUCHED.append(path)


sys.addaudithook(_audit)


def test_model_names_with_path_parts_are_unknown(tmp_path: Path, smollm2_path: Path) -> None:
    """A models directory with one model, and another model just outside it: no request name reaches the file
    outside (not even an open or a listing of it), they are all 404 model_not_found."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(smollm2_path)
    outside = tmp_path / "outside-secret.gguf"
    outside.symlink_to(smollm2_path)
    opened: list[str] = []

    def factory(path: str, **options: Any) -> Any:
        opened.append(path)
        return uaii.runtime.Session(path, **options)

    names = ["../outside-secret", "../outside-secret.gguf", str(outside), str(outside.with_suffix("")),
             "smol/../../outside-secret", "/etc/passwd", "..", ".", "smol\x00", "smol.gguf", "a" * 5000, ""]
    with running_server(models_dir=models, session_options=OPTIONS, session_factory=factory,
                        preload=False) as url:
        _WATCHING.append("outside-secret")
        try:
            for name in names:
                r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": name}, timeout=60)
                if name == "":  # no name: the loaded model, and none is loaded yet
                    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_loaded"
                    continue
                assert r.status_code == 404, (name, r.text)
                assert r.json()["error"]["code"] == "model_not_found"
            assert httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "smol"}).status_code == 200
        finally:
            _WATCHING.clear()
    assert TOUCHED == []
    assert opened == [str(models.resolve() / "smol.gguf")]


def test_a_request_for_another_model_loads_it_by_name(tmp_path: Path, smollm2_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (models / name).symlink_to(smollm2_path)
    with running_server(models_dir=models, session_options=OPTIONS) as url:
        listed = httpx.get(url + "/v1/models").json()["data"]
        assert [(m["id"], m["loaded"]) for m in listed] == [("a", False), ("b", False)]
        for name in ("a", "b", "a"):
            assert httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": name}).json()["model"] == name
            assert httpx.get(url + "/health").json()["model"] == name


def test_a_busy_model_is_not_swapped(smollm2_path: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (models / name).symlink_to(smollm2_path)
    state = ServerState(models_dir=models, session_options=OPTIONS, preload="a")
    try:
        assert state.loaded is not None
        handle = state.loaded.engine.submit(_long_request())
        with pytest.raises(Exception, match="serving requests") as info:
            state.load("b")
        assert getattr(info.value, "status", None) == 409
        handle.cancel()
    finally:
        state.close()


def _long_request() -> Any:
    from uaii.runtime.engine import GenRequest

    return GenRequest(prompt_ids=[1, 2, 3], max_tokens=100, ignore_eos=True)


# ------------------------------------------------------------------------------------------------------- CORS
def test_no_cors_unless_asked(smollm2_path: Path) -> None:
    origin = {"Origin": "http://evil.example"}
    with running_server(model=smollm2_path, session_options=OPTIONS) as url:
        foreign = httpx.get(url + "/v1/models", headers=origin)
        assert foreign.status_code == 403 and "access-control-allow-origin" not in foreign.headers
        assert httpx.options(url + "/v1/models", headers={**origin, "Access-Control-Request-Method": "GET"}
                             ).status_code == 403
    allowed = "http://app.example"
    with running_server(model=smollm2_path, session_options=OPTIONS, cors_origins=(allowed,), api_key=KEY) as url:
        pre = httpx.options(url + "/v1/chat/completions", headers={
            "Origin": allowed, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == allowed
        assert "access-control-allow-origin" not in httpx.get(url + "/health", headers=origin).headers


# --------------------------------------------------------------------------------------------- without extra
def test_without_the_extra_the_command_names_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                smollm2_path: Path) -> None:
    for name in [m for m in sys.modules if m == "uaii.runtime.serve" or m.startswith("uaii.runtime.serve.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(uaii.runtime, "serve", raising=False)
    monkeypatch.setitem(sys.modules, "pydantic", None)  # as if not installed
    assert main(["serve", str(smollm2_path)]) == 1
    err = capsys.readouterr().err
    assert "pydantic is not installed" in err and "pip install 'uaii-runtime[serve]'" in err
    assert len(err.strip().splitlines()) == 1


def test_the_server_names_its_event_loop_and_http_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop and httptools (the serve extra's) when importable, else asyncio's loop and h11, never uvicorn's
    "auto" guess."""
    from uaii.runtime.cli import serve as serve_cli

    assert serve_cli.server_stack() == ("uvloop" if sys.platform != "win32" else "asyncio", "httptools")
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "httptools", None)
    assert serve_cli.server_stack() == ("asyncio", "h11")


# ------------------------------------------------------------------------------------------ web pages, rebinding
@pytest.fixture(scope="module")
def keyless(smollm2_path: Path) -> Iterator[str]:
    with running_server(model=smollm2_path, session_options=OPTIONS) as url:
        yield url


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


def test_keyless_server_answers_only_loopback_hosts(keyless: str, keyed: str) -> None:
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 sends Host evil.example."""
    port = _port(keyless)
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.nip.example:{port}", ""):
        r = httpx.get(keyless + "/v1/models", headers={"Host": host})
        assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
        assert httpx.post(keyless + "/api/unload", json={}, headers={"Host": host}).status_code == 403
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "LOCALHOST:1"):
        assert httpx.get(keyless + "/v1/models", headers={"Host": host}).status_code == 200, host
    # a server with a key answers any name (a reverse proxy's); the key is what a rebinding page lacks
    assert call(keyed, "GET", "/v1/models", None, KEY).status_code == 200
    assert httpx.get(keyed + "/v1/models", headers={"Host": "api.example", "Authorization": f"Bearer {KEY}"}
                     ).status_code == 200


def test_foreign_origins_are_refused(keyless: str, keyed: str) -> None:
    own = f"http://127.0.0.1:{_port(keyless)}"
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{int(_port(keyless)) + 1}", "file://"):
        r = httpx.post(keyless + "/v1/chat/completions", json=CHAT, headers={"Origin": origin}, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", (origin, r.text)
    assert httpx.post(keyless + "/v1/chat/completions", json=CHAT, headers={"Origin": own}, timeout=60
                      ).status_code == 200  # the dashboard: the server's own page
    r = httpx.get(keyed + "/v1/models", headers={"Origin": "http://evil.example", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 403  # with a key too: a page must not drive the server with a key it was given


def test_an_allowed_cors_origin_passes(smollm2_path: Path) -> None:
    allowed = "http://app.example:3000"
    with running_server(model=smollm2_path, session_options=OPTIONS, cors_origins=(allowed,)) as url:
        r = httpx.post(url + "/v1/chat/completions", json=CHAT, headers={"Origin": allowed}, timeout=60)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == allowed
        assert httpx.get(url + "/v1/models", headers={"Origin": "http://app.example"}).status_code == 403


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", {"prompt": "Hi"}),
                                        ("/tokenize", {"content": "Hi"}), ("/api/unload", {}),
                                        ("/v1/embeddings", {"input": "Hi"})])
def test_api_posts_must_be_json(keyless: str, path: str, body: Any) -> None:
    """A text/plain or form body is what a page may POST cross-site without a preflight: 415, unparsed."""
    import json

    raw = json.dumps(body)
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"content-type": kind} if kind else {}
        r = httpx.post(keyless + path, content=raw, headers=headers, timeout=60)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", (kind, r.text)
    assert httpx.get(keyless + "/health").status_code == 200
    assert httpx.post(keyless + "/tokenize", content=json.dumps({"content": "Hi"}),
                      headers={"content-type": "Application/JSON; charset=utf-8"}).status_code == 200


def test_guard_rules() -> None:
    assert host_allowed("127.0.0.1:80", None) and host_allowed("[::1]", None) and host_allowed("localhost:1", None)
    assert host_allowed("10.0.0.5:8080", "10.0.0.5") and not host_allowed("10.0.0.5:8080", "127.0.0.1")
    assert not host_allowed("evil.example", "127.0.0.1") and not host_allowed("", "127.0.0.1")
    assert origin_allowed("http://localhost:8080", "localhost:8080", ())
    assert origin_allowed("https://box.example", "box.example", ())  # a TLS proxy's page: same host, default port
    assert not origin_allowed("http://localhost:8081", "localhost:8080", ())
    assert not origin_allowed("http://evil.example", "evil.example.local", ())
    assert origin_allowed("http://app.example/", "localhost:8080", ("http://app.example",))
    assert is_json("application/json") and is_json("application/json; charset=utf-8")
    assert not is_json("text/plain") and not is_json("application/jsonp") and not is_json("")


def test_banner_shows_the_effective_context() -> None:
    """--max-context 256 with the preset's 2048-token window: the context, and no window that bounds nothing."""
    from types import SimpleNamespace

    from uaii.runtime.cli.serve import memory_lines
    from uaii.runtime.presets import Preset

    def state(context: int, window: int) -> Any:
        session = SimpleNamespace(context=context, options=SimpleNamespace(kv_window=window))
        return SimpleNamespace(preset=Preset("auto", 1 << 30, kv_window=2048), loaded=SimpleNamespace(session=session))

    assert memory_lines(state(256, 2048)) == ["memory: preset auto (budget 1.0 GiB, kv cache f16)",
                                              "context: 256 tokens a sequence"]
    assert memory_lines(state(8192, 2048))[1] == "context: 8192 tokens a sequence, kv window 2048"
    assert memory_lines(SimpleNamespace(preset=None, loaded=None)) == []
