"""The OpenAI-compatible routes: ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/chat/completions``,
``POST /v1/completions``, and llama-server's ``POST /tokenize`` / ``POST /detokenize``.

A generation request is parsed (schemas.py), its model found or loaded (state.py), its prompt tokenized in a
worker thread (a 4 MiB prompt must not stall the event loop), checked against the limits, and submitted to the
model's Engine; the reply is the Engine's events, shaped by :class:`Reply` into one JSON body or into SSE chunks
(``data: {json}`` frames ending with ``data: [DONE]``, sent by serve/sse.py; a token's frame comes from a template,
Reply.text_frame). The request's sequence is cancelled as soon as its client is gone, streaming or not.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from uaii.ir import UaiiError
from uaii.runtime.engine import EngineError, GenRequest
from uaii.runtime.sampling import SamplingError, SamplingParams

from .errors import ApiError, error_body
from .reply import Reply
from .schemas import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, parse
from .sse import SseResponse, frame
from .state import Lease, LoadedModel, ServerState

# OpenAI's defaults where the request says nothing
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
SMALLEST_TOP_P = 1e-9  # what top_p 0 means: a nucleus of the most probable token alone


async def list_models(request: Request) -> Response:
    """Every model of the registry (OpenAI's list shape); ``loaded`` says which one is in memory."""
    state: ServerState = request.app.state.uaii
    loaded = state.loaded
    data = [{"id": e.name, "object": "model", "created": int(e.mtime), "owned_by": "uaii",
             "loaded": loaded is not None and loaded.name == e.name} for e in state.registry]
    return JSONResponse({"object": "list", "data": data})


async def retrieve_model(request: Request) -> Response:
    """One model of the registry (openai's ``client.models.retrieve``); 404 ``model_not_found`` for another name
    (a dict lookup: the name never becomes a path)."""
    state: ServerState = request.app.state.uaii
    entry = state.registry.get(request.path_params["model"])
    loaded = state.loaded
    return JSONResponse({"id": entry.name, "object": "model", "created": int(entry.mtime), "owned_by": "uaii",
                         "loaded": loaded is not None and loaded.name == entry.name})


# --------------------------------------------------------------------------------------------- prompts
def chat_prompt(session: Any, request: ChatRequest) -> list[int]:
    """The chat template applied to the messages, as token ids (with the assistant's turn opened)."""
    tok = _tokenizer(session)
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    refuse_unfittable(session, "".join(m["content"].strip() for m in messages), "messages")  # templates strip
    try:
        return [int(t) for t in tok.encode_chat(messages, add_generation_prompt=True)]
    except UaiiError as exc:
        raise ApiError(400, f"cannot apply the model's chat template: {exc}", param="messages") from None


def completion_prompt(session: Any, request: CompletionRequest) -> list[int]:
    """The prompt as token ids: text is tokenized (with BOS as the model adds it), ids are taken as they are."""
    prompt = request.one_prompt()
    if request.suffix is not None:
        if not isinstance(prompt, str):
            raise ApiError(400, "'suffix' needs a text prompt, found token ids", param="suffix")
        return fim_prompt(session, prompt, request.suffix)
    if isinstance(prompt, str):
        refuse_unfittable(session, prompt, "prompt")
        ids = [int(t) for t in _tokenizer(session).encode(prompt, add_special=True)]
    else:
        ids = [int(t) for t in prompt]  # a list of one prompt was unpacked above
        vocab = _vocab_size(session)
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt")
    if not ids:
        raise ApiError(400, "the prompt is empty (no tokens)", param="prompt")
    return ids


def fim_prompt(session: Any, prompt: str, suffix: str) -> list[int]:
    """Fill-in-the-middle, PSM order: ``[BOS] <PRE> prompt <SUF> suffix <MID>`` with the model's FIM ids
    (``Tokenizer.fim_tokens``: GGUF metadata, else the vocabulary's FIM pieces); the model writes the middle.
    The texts are tokenized without special tokens (BOS goes first, where the model adds one); a model without FIM
    ids is a 400."""
    tok = _tokenizer(session)
    fim = tok.fim_tokens()
    if fim is None:
        name = str(getattr(tok, "path", "") or "?").rstrip("/").rsplit("/", 1)[-1]
        raise ApiError(400, f"model {name} has no fill-in-the-middle tokens (fim_pre/fim_suf/fim_mid, or FIM "
                            "pieces such as <|fim_prefix|> in its vocabulary); 'suffix' cannot be used with it",
                       code="fim_unsupported", param="suffix")
    bos = tok.bos_id if tok.add_bos else None
    return fim.prompt([int(t) for t in tok.encode(prompt, add_special=False)],
                      [int(t) for t in tok.encode(suffix, add_special=False)], bos)


def _tokenizer(session: Any) -> Any:
    tok = session.tokenizer
    if tok is None:
        raise ApiError(400, "the loaded model has no tokenizer; send token ids to /v1/completions")
    return tok


def _vocab_size(session: Any) -> int:
    tok = session.tokenizer
    return int(getattr(tok, "vocab_size", 0) or 0) if tok is not None else 0


_LONGEST: dict[int, tuple[Any, int]] = {}  # id(tokenizer) -> (a weak reference to it, its longest token's bytes)


def longest_token_bytes(tok: Any) -> int:
    """The most bytes of text one token of ``tok`` stands for (special tokens' text included); once per
    tokenizer. A piece's UTF-8 length when the tokenizer cannot say its bytes (never fewer: ``Ġ``, ``▁`` and
    ``<0x41>`` are longer than the byte they stand for), so the bound below stays a lower one."""
    cached = _LONGEST.get(id(tok))
    if cached is not None and cached[0]() is tok:
        return cached[1]
    raw = getattr(tok, "token_bytes", None)
    size = (lambda i: len(raw(i, skip_special=False))) if raw is not None else (
        lambda i: len(tok.id_to_piece(i).encode("utf-8")))
    longest = max((size(i) for i in range(int(tok.vocab_size))), default=1)
    with contextlib.suppress(TypeError):
        _LONGEST[id(tok)] = (weakref.ref(tok), max(longest, 1))
    return max(longest, 1)


def refuse_unfittable(session: Any, text: str, field: str) -> None:
    """Before tokenizing ``text`` (4 MB take seconds of CPU): every byte of it is in some token and no token
    stands for more than L bytes, so it makes at least len(UTF-8) / L tokens; when that alone fills the context,
    the request is refused untokenized. Tokenizers that normalize (BERT's whitespace stripping, lower-casing) can
    make fewer tokens than that bound: they are left to the exact check after tokenizing."""
    tok = session.tokenizer
    context = int(session.context)
    if tok is None or session.slides or len(text) < context or any(k in tok.kind for k in ("bert", "wordpiece")):
        return  # (a text of fewer characters than the context cannot pass the bound: L >= 1, bytes < 4 x chars)
    size, longest = len(text.encode("utf-8", "surrogatepass")), longest_token_bytes(tok)
    prompt_fits(session, size // longest, field,
                at_least=f"{size} bytes of text, and no token of this model stands for more than {longest}")


# -------------------------------------------------------------------------------------------- submitting
def sampling_of(body: ChatRequest | CompletionRequest) -> SamplingParams:
    """The request's sampler. OpenAI's edge values mapped to ours: ``top_p`` 0 is the smallest nucleus (the top
    token alone; our top_p must be > 0), a negative ``seed`` a fresh random one (llama.cpp's -1)."""
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    top_p = DEFAULT_TOP_P if body.top_p is None else body.top_p
    seed = body.seed if body.seed is None or body.seed >= 0 else None
    try:
        return SamplingParams(temperature=temperature, top_p=top_p or SMALLEST_TOP_P, seed=seed)
    except SamplingError as exc:
        raise ApiError.of(400, exc) from None


def prompt_fits(session: Any, tokens: int, field: str, *, at_least: str = "") -> None:
    """400 ``context_length_exceeded`` on ``field`` when a prompt of ``tokens`` leaves no room for one generated
    token (a sliding window has no such limit); ``at_least`` says how a lower bound was found."""
    context = int(session.context)
    if not session.slides and tokens >= context:
        size = f"at least {tokens} tokens ({at_least})" if at_least else f"{tokens} tokens"
        raise ApiError(400, f"the prompt is {size}; this model's context is {context} tokens, which leaves no room "
                            f"for a reply: shorten the {field}", code="context_length_exceeded", param=field)


def max_tokens_of(state: ServerState, session: Any, requested: int | None, prompt_len: int, field: str) -> int:
    """The tokens to generate: the request's (1 ..= the server's limit), else what the context leaves."""
    limit = state.limits.max_tokens
    if requested is None:
        room = max(int(session.context) - prompt_len, 1)
        return min(room, limit) if limit is not None else room
    if requested < 1:
        raise ApiError(400, f"'{field}' must be >= 1, found {requested}", param=field)
    if limit is not None and requested > limit:
        raise ApiError(400, f"'{field}' is {requested}, over this server's limit of {limit} tokens "
                            "(uaii serve --max-tokens-limit)", param=field)
    return requested


def submit(state: ServerState, loaded: LoadedModel, ids: list[int], body: ChatRequest | CompletionRequest,
           logprobs: int | None) -> Any:
    """The request handed to the engine (its limits first; the engine checks the context); returns the Handle."""
    field = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    prompt_fits(loaded.session, len(ids), "messages" if isinstance(body, ChatRequest) else "prompt")
    max_tokens = max_tokens_of(state, loaded.session, body.token_limit(), len(ids), field)
    req = GenRequest(prompt_ids=ids, max_tokens=max_tokens, sampling=sampling_of(body), stop=body.stops(),
                     logprobs=logprobs, ignore_eos=body.ignore_eos)
    engine = loaded.engine
    if engine is None:  # an encoder: _generate refused it before tokenizing
        raise ApiError(400, f"model {loaded.name} is an embedding model; it does not generate", param="model")
    try:
        return engine.submit(req)
    except EngineError as exc:
        session = loaded.session
        over = not session.slides and len(ids) + max_tokens > int(session.context)
        raise ApiError(400, str(exc), code="context_length_exceeded" if over else "invalid_value",
                       param=field if over else None) from None


# ------------------------------------------------------------------------------------------------ routes
async def chat_completions(request: Request) -> Response:
    body = parse(ChatRequest, await request.body())
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs and not body.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return await _generate(request, body, "chat", chat_prompt, logprobs)


async def completions(request: Request) -> Response:
    body = parse(CompletionRequest, await request.body())
    if body.echo:
        raise ApiError(400, "'echo' is not supported (the reply does not repeat the prompt)",
                       code="unsupported_parameter", param="echo")
    return await _generate(request, body, "text", completion_prompt, body.logprobs)


async def _generate(request: Request, body: Any, kind: str, prompt_of: Any, logprobs: int | None) -> Response:
    """The model is leased for the whole request (state.py: no load or unload closes it meanwhile): a plain
    reply gives the lease back here, a stream when its SSE generator ends (or its client leaves)."""
    state: ServerState = request.app.state.uaii
    lease = await run_in_threadpool(state.lease, body.model)
    try:
        response = await _reply(request, body, kind, prompt_of, logprobs, lease)
    except BaseException:
        lease.release()
        raise
    if not body.stream:
        lease.release()
    return response


async def _reply(request: Request, body: Any, kind: str, prompt_of: Any, logprobs: int | None,
                 lease: Lease) -> Response:
    state: ServerState = request.app.state.uaii
    loaded = lease.model
    if not loaded.generative:  # an encoder is loaded without an engine: it serves /v1/embeddings only
        raise ApiError(400, f"model {loaded.name} is an embedding model; it does not generate (use /v1/embeddings)",
                       code="model_not_generative", param="model")
    ids = await run_in_threadpool(prompt_of, loaded.session, body)
    handle = submit(state, loaded, ids, body, logprobs)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    prompt_text = body.one_prompt() if kind == "text" else ""  # text_offset counts from the prompt's start
    prompt_text = prompt_text if isinstance(prompt_text, str) else ""
    reply = Reply(kind, loaded.name, loaded.session, logprobs is not None, include_usage, len(prompt_text))
    if body.stream:
        def client_left() -> None:
            left.append(True)
            handle.cancel()
            lease.release()  # also in _sse's finally: a generator that never started has no finally to run

        left: list[bool] = []
        return SseResponse(_sse(handle, reply, lease, left), on_disconnect=client_left)
    events = await _collect(handle, request)
    failed = next((e for e in events if e.finish_reason == "error"), None)
    if failed is not None:  # a pass failed (the engine said why); the server goes on with the others
        raise ApiError(500, failed.error or "the generation failed", code="generation_failed")
    return JSONResponse(reply.response(events))


async def _sse(handle: Any, reply: Reply, lease: Lease, left: list[bool]) -> AsyncIterator[bytes]:
    """The SSE frames; the sequence is cancelled and the model's lease given back however the stream ends (a
    client that left included). Events that stop without a finish reason while the client is there mean the engine
    ended the request (an unload, a shutdown): an error frame says so before ``[DONE]``. A token's frame comes from
    :meth:`Reply.chunk_texts` (a template when it carries text alone: no dict is built per token)."""
    try:
        for chunk in reply.opening():
            yield frame(json.dumps(chunk))
        async for event in handle.aevents():
            if event.finish_reason == "error":  # OpenAI streams a failure as an error frame
                yield frame(json.dumps(error_body(500, event.error or "the generation failed", "generation_failed")))
                break
            for text in reply.chunk_texts(event):
                yield frame(text)
        else:
            if not reply.finished and not left:  # ended by the engine, not by its client
                yield frame(json.dumps(reply.cut_short_frame()))
                yield frame("[DONE]")
                return
        for chunk in reply.closing():
            yield frame(json.dumps(chunk))
        yield frame("[DONE]")
    finally:
        handle.cancel()
        lease.release()


async def _collect(handle: Any, request: Request) -> list[Any]:
    """Every event of ``handle``; cancels it the moment the client disconnects."""
    events: list[Any] = []

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        handle.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            async for event in handle.aevents():
                events.append(event)
            tg.cancel_scope.cancel()
    finally:
        handle.cancel()  # a no-op once it finished
    return events


async def tokenize(request: Request) -> Response:
    """llama-server's ``{"content": str, "add_special": bool}`` -> ``{"tokens": [ids]}``."""
    body = parse(TokenizeRequest, await request.body())
    async with request.app.state.uaii.use_model(body.model) as loaded:  # no unload closes it meanwhile
        tok = _tokenizer(loaded.session)
        ids = await run_in_threadpool(lambda: tok.encode(body.content, add_special=body.add_special))
    return JSONResponse({"tokens": [int(t) for t in ids]})


async def detokenize(request: Request) -> Response:
    """``{"tokens": [ids]}`` -> ``{"content": str}``."""
    body = parse(DetokenizeRequest, await request.body())
    async with request.app.state.uaii.use_model(body.model) as loaded:  # no unload closes it meanwhile
        vocab = _vocab_size(loaded.session)
        bad = [t for t in body.tokens if vocab and t >= vocab]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="tokens")
        text = await run_in_threadpool(_tokenizer(loaded.session).decode, body.tokens)
    return JSONResponse({"content": text})


def openai_routes() -> list[BaseRoute]:
    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]


__all__ = ["chat_prompt", "completion_prompt", "fim_prompt", "max_tokens_of", "openai_routes", "sampling_of",
           "submit"]
