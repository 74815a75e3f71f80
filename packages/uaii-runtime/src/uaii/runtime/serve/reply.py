"""OpenAI's reply shapes, built from the Engine's events: one ``chat.completion`` / ``text_completion`` body, or
the chunks of a stream (``chat.completion.chunk``; ``text_completion`` for completions).

A stream opens (chat: a chunk with ``delta.role``), carries one chunk per piece of text (with its ``logprobs`` when
asked), one chunk with the ``finish_reason``, and — with ``stream_options.include_usage`` — a last chunk with
``choices: []`` and the usage; every other chunk has ``usage: null``. The chunk with the finish reason and the
whole body also carry ``timings`` (time to first token, decode tokens/s), as llama-server's replies do; clients
ignore fields they do not know.

A request the engine ended without a finish reason — its model unloaded or the server stopping, not its client
leaving — has no reply to give: the body is a 503 (``code: "model_unloaded"``), a stream ends with an error frame
before ``[DONE]`` (:meth:`Reply.cut_short`), never a quiet ``finish_reason: "stop"``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from uaii.runtime import __version__ as _version

from .errors import ApiError, error_body


def system_fingerprint() -> str:
    """Names the software that produced a reply (OpenAI: the backend configuration)."""
    return f"uaii-{_version}"


def token_piece(tokenizer: Any, token_id: int) -> tuple[str, list[int]]:
    """One token's text and UTF-8 bytes (the bytes of a token that is part of a character are its own bytes)."""
    raw = getattr(tokenizer, "token_bytes", None)
    if raw is not None:
        data = bytes(raw(int(token_id), skip_special=False))
        return data.decode("utf-8", "replace"), list(data)
    text = str(tokenizer.decode([int(token_id)], skip_special=False)) if tokenizer is not None else ""
    return text, list(text.encode("utf-8"))


def usage_of(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    return {"prompt_tokens": int(usage.prompt_tokens), "completion_tokens": int(usage.completion_tokens),
            "total_tokens": int(usage.total_tokens)}


def timings_of(usage: Any) -> dict[str, float] | None:
    if usage is None:
        return None
    return {"ttft_s": float(getattr(usage, "ttft_s", 0.0) or 0.0),
            "decode_tok_s": float(getattr(usage, "decode_tok_s", 0.0) or 0.0)}


class Reply:
    """The reply to one request: ``kind`` "chat" or "text", the model's name, its session (token texts), whether
    logprobs were asked, whether the stream ends with a usage chunk, and where the completion's text starts
    (completions' ``text_offset`` counts from the start of the prompt)."""

    def __init__(self, kind: str, model: str, session: Any, logprobs: bool, include_usage: bool,
                 text_start: int = 0) -> None:
        self.chat = kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.tokenizer = session.tokenizer
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.offset = text_start
        self.usage: Any = None
        self.finished = False  # a chunk with the finish reason went out
        self._text_template: tuple[str, str] | None = None

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": system_fingerprint()}

    # --- logprobs ------------------------------------------------------------------------------------------
    def _logprobs(self, events: list[Any]) -> dict[str, Any] | None:
        events = [e for e in events if e.token_id is not None and e.logprob is not None]
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_item(e) for e in events]}
        tokens, offsets = [], []
        for e in events:
            text, _ = token_piece(self.tokenizer, e.token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(e.text)
        return {"tokens": tokens, "token_logprobs": [float(e.logprob) for e in events],
                "top_logprobs": [{t: float(lp) for _, t, lp in (e.top_logprobs or [])} for e in events],
                "text_offset": offsets}

    def _chat_item(self, event: Any) -> dict[str, Any]:
        text, data = token_piece(self.tokenizer, event.token_id)
        top = []
        for token_id, _, lp in event.top_logprobs or []:
            t, b = token_piece(self.tokenizer, token_id)
            top.append({"token": t, "logprob": float(lp), "bytes": b})
        return {"token": text, "logprob": float(event.logprob), "bytes": data, "top_logprobs": top}

    # --- streaming -----------------------------------------------------------------------------------------
    def _chunk(self, text: str | None, logprobs: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice], "usage": None}
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice], "usage": None}

    def text_frame(self, text: str) -> str:
        """``json.dumps`` of the chunk that carries ``text`` alone (no logprobs, no finish reason), from a template
        made once: the same bytes as the dict's, without building and encoding the dict per token."""
        if self._text_template is None:
            marker = "\x00uaii-text\x00"
            head, tail = json.dumps(self._chunk(marker, None, None)).split(json.dumps(marker))
            self._text_template = head, tail
        return self._text_template[0] + json.dumps(text) + self._text_template[1]

    def opening(self) -> list[dict[str, Any]]:
        if not self.chat:
            return []
        chunk = self._chunk("", None, None)
        chunk["choices"][0]["delta"] = {"role": "assistant", "content": ""}
        return [chunk]

    def chunks(self, event: Any) -> list[dict[str, Any]]:
        out = []
        token = event.token_id is not None
        if event.text or (token and self.logprobs):
            out.append(self._chunk(event.text, self._logprobs([event]) if token else None, None))
        if event.finish_reason is not None:
            self.finished = True
            self.usage = event.usage
            last = self._chunk(None, None, event.finish_reason)
            last["timings"] = timings_of(event.usage)
            out.append(last)
        return out

    def chunk_texts(self, event: Any) -> list[str]:
        """The JSON of :meth:`chunks` — a token that carries text alone (most of them) from :meth:`text_frame`'s
        template, without building and encoding its dict."""
        if event.text and event.finish_reason is None and not self.logprobs:
            return [self.text_frame(event.text)]
        return [json.dumps(chunk) for chunk in self.chunks(event)]

    def cut_short(self) -> ApiError:
        """The error of a request the engine ended before its finish reason (see the module docstring)."""
        return ApiError(503, f"the request on {self.model!r} ended before its reply was complete: the model "
                             "was unloaded or the server is stopping; retry it", code="model_unloaded")

    def cut_short_frame(self) -> dict[str, Any]:
        """:meth:`cut_short` as a stream's error frame (``data: {"error": {...}}``, as OpenAI sends mid-stream)."""
        exc = self.cut_short()
        return error_body(exc.status, str(exc), exc.code)

    def closing(self) -> list[dict[str, Any]]:
        if not self.include_usage:
            return []
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return [{**head, "choices": [], "usage": usage_of(self.usage)}]

    # --- one body ------------------------------------------------------------------------------------------
    def response(self, events: list[Any]) -> dict[str, Any]:
        text = "".join(e.text for e in events)
        final = next((e for e in reversed(events) if e.finish_reason is not None), None)
        if final is None:
            raise self.cut_short()
        finish, usage = final.finish_reason, final.usage
        logprobs = self._logprobs(events)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": logprobs, "finish_reason": finish}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": usage_of(usage), "timings": timings_of(usage)}


__all__ = ["Reply", "system_fingerprint", "timings_of", "token_piece", "usage_of"]
