"""Who may call: the API key, and the guard against web pages.

The API key: when the server has one, every request but ``/health`` and the dashboard's static shell (``/``,
``/static/...``: no data in them) must carry ``Authorization: Bearer KEY``; compared in constant time.
:func:`api_key_for` is the start-up policy: loopback needs no key; any other bind address needs one, given
(``--api-key``) or generated here and printed by ``uaii serve``.

A keyless loopback server is still reachable from every web page the user's browser opens, so
:class:`BrowserGuard` refuses what only a foreign page would send: a ``Host`` that is not a loopback name or the
bound address (DNS rebinding: ``evil.example`` resolved to 127.0.0.1; only without a key, which a rebinding page
does not have), an ``Origin`` that is neither the server's own nor a ``--cors-origin`` (403, with or without a key),
and a POST to the API whose body is not declared ``application/json`` (415: a form or ``text/plain`` body is the
one kind a page may send cross-origin without a CORS preflight).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import error_response

OPEN_PATHS = frozenset({"/health", "/"})
OPEN_PREFIXES = ("/static/",)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def api_key_for(host: str, key: str | None) -> tuple[str | None, bool]:
    """(the key the server checks, whether it was generated now). A given key is always checked."""
    if key:
        return key, False
    if is_loopback(host):
        return None, False
    return secrets.token_urlsafe(32), True


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def bearer(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (of the UTF-8 bytes: compare_digest refuses non-ASCII str)."""
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                                                     expected.encode("utf-8"))


class ApiKeyMiddleware:
    """401 in OpenAI's error shape for a request without the right key (CORS preflights pass: the CORS middleware
    outside this one answers them, and they carry no credentials by design)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = bearer(Headers(scope=scope))
        if not key_matches(given, self.api_key):
            what = "no API key was sent" if given is None else "the API key is not valid"
            response = error_response(401, f"[serve] {what}; send 'Authorization: Bearer KEY' (the key uaii serve "
                                           "printed or was given with --api-key)", "invalid_api_key",
                                      headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


JSON_PREFIXES = ("/v1/", "/api/", "/tokenize", "/detokenize")  # POSTs whose body must be application/json


def split_host(authority: str) -> tuple[str, str]:
    """``host[:port]`` or ``[v6][:port]`` -> (host lower-cased, without brackets; port or "")."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        return host, rest.removeprefix(":")
    host, _, port = authority.partition(":")
    return host, port


def host_allowed(host_header: str, bound: str | None) -> bool:
    """A Host a browser sends only when it meant this machine: a loopback address or name, or the bound address
    (any port). A name that merely resolves to 127.0.0.1 (DNS rebinding) is not one of them."""
    host, _ = split_host(host_header)
    return bool(host) and (is_loopback(host) or (bound is not None and host == bound.strip("[]").lower()))


def origin_allowed(origin: str, host_header: str, cors_origins: tuple[str, ...]) -> bool:
    """The server's own origin (the page it served: same host and port, whatever the scheme a TLS proxy shows)
    or one named by --cors-origin. ``null`` (sandboxed frames, files) is neither."""
    if origin.rstrip("/") in {o.rstrip("/") for o in cors_origins}:
        return True
    scheme, sep, authority = origin.partition("://")
    if not sep or not scheme or not authority:
        return False
    given, port = split_host(authority)
    own, own_port = split_host(host_header)
    default = {"http": "80", "https": "443"}.get(scheme.lower(), "")
    return given == own and (port or default) == (own_port or default)


def is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


class BrowserGuard:
    """403 for a foreign Host (keyless servers) or Origin, 415 for an API POST that is not JSON; see the module
    docstring for why. Outside the API key check: a page is refused before its lack of a key is."""

    def __init__(self, app: ASGIApp, keyless: bool, cors_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.keyless = keyless
        self.cors_origins = tuple(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> Any:
        headers = Headers(scope=scope)
        host, origin = headers.get("host", ""), headers.get("origin")
        bound = (scope.get("server") or (None,))[0]
        if self.keyless and not host_allowed(host, bound):
            return error_response(403, f"[serve] Host {host[:80]!r} is not this machine's (a loopback address "
                                       "or name); a server without an API key answers only those (give "
                                       "--api-key to serve other names)", "host_not_allowed")
        if origin is not None and not origin_allowed(origin, host, self.cors_origins):
            return error_response(403, f"[serve] requests from the web page at {origin[:80]!r} are not allowed "
                                       "(allow an origin with uaii serve --cors-origin)", "origin_not_allowed")
        path = scope["path"]
        if scope["method"] == "POST" and path.startswith(JSON_PREFIXES) and not is_json(
                headers.get("content-type", "")):
            found = headers.get("content-type") or "none"
            return error_response(415, f"[serve] POST {path} needs 'Content-Type: application/json', found "
                                       f"{found[:80]!r}", "unsupported_media_type")
        return None


__all__ = ["ApiKeyMiddleware", "BrowserGuard", "api_key_for", "bearer", "host_allowed", "is_json", "is_loopback",
           "is_open", "key_matches", "origin_allowed"]
