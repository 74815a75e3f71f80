"""The API key: when the server has one, every request but ``/health`` and the dashboard's static shell (``/``,
``/static/...``: no data in them) must carry ``Authorization: Bearer KEY``; compared in constant time.

:func:`api_key_for` is the start-up policy: loopback needs no key; any other bind address needs one, given
(``--api-key``) or generated here and printed by ``uaii serve``.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

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


__all__ = ["ApiKeyMiddleware", "api_key_for", "bearer", "is_loopback", "is_open", "key_matches"]
