"""``create_app(state)``: the Starlette application of `uaii serve` — its routes (one list, ``ROUTES``, built by
:func:`build_routes`), middleware and error handlers.

Middleware, outermost first: CORS (only with ``--cors-origin``), request counting (/metrics), the browser guard
(auth.BrowserGuard: foreign Host or Origin 403, a non-JSON API POST 415), the API key (when the server has one), the
Content-Length check (a declared body over the limit: 413 before a byte of it is read), then starlette's own body
limit (RequestBodyLimitMiddleware: a body without a length is refused with 413 as soon as the bytes read pass the
limit, never buffered whole) and the error handlers that give every refusal OpenAI's error shape (errors.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from . import metrics
from .auth import ApiKeyMiddleware, BrowserGuard
from .dashboard import dashboard_routes
from .embeddings import embedding_routes
from .errors import EXCEPTION_HANDLERS, error_response
from .openai_api import openai_routes
from .state import ServerState


async def health(request: Request) -> Response:
    """200 ``{"status": "ok"}`` when requests can be served, 503 ``{"status": "loading"}`` while a model loads."""
    state: ServerState = request.app.state.uaii
    status = state.health()
    loaded = state.loaded
    body = {"status": status, "model": loaded.name if loaded is not None else None}
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


MetricsPage = Callable[[ServerState], Awaitable[str]]


async def local_metrics(state: ServerState) -> str:
    """The /metrics page of this process's server (the default of :func:`create_app`)."""
    return metrics.render(state)


async def prometheus(request: Request) -> Response:
    page: MetricsPage = request.app.state.metrics_page
    return Response(await page(request.app.state.uaii), media_type=metrics.CONTENT_TYPE)


class DeclaredLengthLimit:
    """413 in OpenAI's shape for a request whose Content-Length is over the limit, without reading its body
    (starlette's limit answers such a request in plain text; bodies without a length are left to it)."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = Headers(scope=scope).get("content-length", "")
            if declared.isdigit() and int(declared) > self.max_body:
                response = error_response(413, f"[serve] the request body ({int(declared)} bytes) is larger than "
                                               f"the limit of {self.max_body} bytes (uaii serve --max-body)",
                                          "request_too_large")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_routes(state: ServerState) -> list[BaseRoute]:
    """Every route of the server, in one list (the dashboard and the embeddings add theirs here)."""
    ROUTES: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        *openai_routes(),
        *dashboard_routes(),
        *embedding_routes(),
    ]
    return ROUTES


def build_middleware(state: ServerState) -> list[Middleware]:
    stack = []
    if state.cors_origins:
        stack.append(Middleware(CORSMiddleware, allow_origins=list(state.cors_origins), allow_methods=["*"],
                                allow_headers=["*"]))
    stack.append(Middleware(metrics.MetricsMiddleware, metrics=state.metrics))
    stack.append(Middleware(BrowserGuard, keyless=not state.api_key, cors_origins=state.cors_origins))
    if state.api_key:
        stack.append(Middleware(ApiKeyMiddleware, api_key=state.api_key))
    stack.append(Middleware(DeclaredLengthLimit, max_body=state.limits.max_body))
    stack.append(Middleware(RequestBodyLimitMiddleware, max_body_size=state.limits.max_body))
    return stack


def create_app(state: ServerState, *, metrics_page: MetricsPage = local_metrics) -> Starlette:
    """The ASGI app serving ``state``; closing the app (lifespan shutdown) closes the state's model.
    ``metrics_page`` renders /metrics: this server's figures, or (a Ray replica, serve/ray_replicas.py) those of
    every replica of the deployment."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            state.close()

    app = Starlette(routes=build_routes(state), middleware=build_middleware(state),
                    exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.uaii = state
    app.state.metrics_page = metrics_page
    return app


__all__ = ["MetricsPage", "build_middleware", "build_routes", "create_app", "health", "local_metrics"]
