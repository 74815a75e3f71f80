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
from uaii.runtime.serve.auth import api_key_for, is_loopback, is_open  # noqa: E402

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
        assert "access-control-allow-origin" not in httpx.get(url + "/v1/models", headers=origin).headers
        assert httpx.options(url + "/v1/models", headers={**origin, "Access-Control-Request-Method": "GET"}
                             ).status_code == 405
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
    monkeypatch.setitem(sys.modules, "sse_starlette", None)  # as if not installed
    assert main(["serve", str(smollm2_path)]) == 1
    err = capsys.readouterr().err
    assert "sse_starlette is not installed" in err and "pip install 'uaii-runtime[serve]'" in err
    assert len(err.strip().splitlines()) == 1
