"""Errors of the server and their OpenAI JSON shape: ``{"error": {"message", "type", "param", "code"}}``.

Handlers raise :class:`ApiError` (a ``UaiiError``, component ``serve``) with the HTTP status and OpenAI's ``type``
and ``code``; the app's exception handlers turn it, starlette's HTTPException (unknown route: 404, wrong method:
405) and any unexpected exception (500, logged with its traceback: a bug of ours) into that one shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from uaii.ir import UaiiError

log = logging.getLogger("uaii.serve")

# HTTP status -> OpenAI's error type
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "invalid_request_error", 405: "invalid_request_error", 409: "conflict_error",
               413: "invalid_request_error", 415: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "server_error"}


class ServeError(UaiiError):
    """The server cannot start or serve as configured (a models directory that is not one, a bad option)."""

    component = "serve"


class ApiError(ServeError):
    """A request the server refuses, with the HTTP status and the OpenAI ``code``/``param`` it is reported with.
    A 400 without a more specific code is ``invalid_value``: clients branch on the code, so none goes without."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code if code is not None or status != 400 else "invalid_value"
        self.param = param

    @classmethod
    def of(cls, status: int, exc: Exception, *, code: str | None = None, param: str | None = None) -> ApiError:
        """``exc`` (another component's error, ``[embedding] ...``) as the server's refusal: the message starts
        with ``[serve]`` as every refusal does, and keeps what the component said."""
        text = str(exc)
        if text.startswith("[") and "] " in text:
            text = text.split("] ", 1)[1]
        return cls(status, f"[serve] {text}", code=code, param=param)


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, str(exc), exc.code, exc.param)


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}


async def http_error(request: Request, exc: Exception) -> Response:
    """starlette's own refusals (no such route, wrong method) in OpenAI's shape, naming the route."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"[serve] no route {request.method} {request.url.path} (see GET /v1/models and docs/serve.md)"
    elif exc.status_code == 413:
        limit = request.app.state.uaii.limits.max_body
        message = f"[serve] the request body is larger than the limit of {limit} bytes (uaii serve --max-body)"
    elif exc.status_code == 405:
        message = f"[serve] {request.url.path} does not accept {request.method}"
    else:
        message = f"[serve] {exc.detail}"
    return error_response(exc.status_code, message, _HTTP_CODES.get(exc.status_code), headers=exc.headers)


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug of ours: logged with its traceback, reported without it."""
    log.error("[serve] %s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"[serve] internal error: {type(exc).__name__}: {exc}", "internal_error")


EXCEPTION_HANDLERS: dict[Any, Any] = {ApiError: api_error, HTTPException: http_error, Exception: internal_error}

__all__ = ["EXCEPTION_HANDLERS", "ApiError", "ServeError", "error_body", "error_response"]
