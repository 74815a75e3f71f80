"""``POST /v1/embeddings`` (OpenAI's shape): unit-norm vectors from the loaded model (uaii.runtime.embedding).

Request: ``input`` (a text, a list of texts, a token-id list or a list of them), ``model``, ``encoding_format``
(``float``, or ``base64``: the little-endian float32 bytes, what the openai client asks for by default) and
``dimensions`` (accepted only when it is the model's own: vectors are not truncated). Response: ``{"object": "list",
"data": [{"object": "embedding", "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``.

Tokenizing and embedding run in a worker thread, never on the event loop; ``Session.embed`` holds the session guard,
so the engine's worker (whose prefill and decode passes hold it too) waits between two of its steps while an
embedding runs, and the streams it serves go on afterwards.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from uaii.runtime.embedding import EmbeddingError, embed_tokens, embedder_dim, token_lists
from uaii.runtime.errors import SessionError

from .errors import ApiError
from .schemas import parse
from .state import ServerState

MAX_INPUTS = 2048  # inputs per request (OpenAI's limit)


class EmbeddingRequest(BaseModel):
    """The body of ``POST /v1/embeddings`` (strict types, unknown fields such as ``user`` ignored)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    input: (str | Annotated[list[str], Field(max_length=MAX_INPUTS)] | list[int]
            | Annotated[list[list[int]], Field(max_length=MAX_INPUTS)])
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


def _run(session: Any, body: EmbeddingRequest) -> tuple[np.ndarray, int]:
    """The vectors and the tokens they cost (worker thread). A wrong ``dimensions`` is refused before any runs."""
    try:
        dim = embedder_dim(session)
        if body.dimensions is not None and body.dimensions != dim:
            raise ApiError(400, f"'dimensions' is {body.dimensions}, but the model gives {dim}-dimensional "
                                "embeddings (they are not truncated)", code="invalid_value", param="dimensions")
        ids = token_lists(session, body.input)
        return embed_tokens(session, ids), sum(len(row) for row in ids)
    except (EmbeddingError, SessionError) as exc:  # SessionError: no tokenizer for a text, closed by an unload
        raise ApiError.of(400, exc, code="invalid_value", param="input") from None


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


async def create_embeddings(request: Request) -> Response:
    body = parse(EmbeddingRequest, await request.body())
    state: ServerState = request.app.state.uaii
    async with state.use_model(body.model) as loaded:  # leased: no load or unload closes it meanwhile
        vectors, tokens = await run_in_threadpool(_run, loaded.session, body)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": loaded.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def embedding_routes() -> list[BaseRoute]:
    return [Route("/v1/embeddings", create_embeddings, methods=["POST"])]


__all__ = ["EmbeddingRequest", "create_embeddings", "embedding_routes"]
