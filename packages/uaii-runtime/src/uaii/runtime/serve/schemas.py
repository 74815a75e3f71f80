"""Request bodies of the OpenAI-compatible routes as pydantic models, and pydantic's complaints made readable.

Strict types (``"max_tokens": "5"`` is refused, as is ``"stream": 1``), unknown fields ignored (clients send
extras: ``user``, ``frequency_penalty: 0`` ...). Every failure becomes one 400 ``invalid_request_error`` naming the
field, what was expected and what was found (:func:`parse`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ApiError

MAX_STOP = 4  # stop sequences per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20  # chat top_logprobs (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs (OpenAI's limit)

Stop = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class _Generation(_Body):
    """The fields chat and completions share."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    max_tokens: int | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=0)] | None = None
    n: int | None = None
    ignore_eos: bool = False  # llama-server's extension: generate max_tokens whatever the model says

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError("only n=1 is supported (this server generates one choice per request)")
        return n

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return tuple(s for s in stops if s)


class ChatRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Generation):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: bool = False

    def token_limit(self) -> int | None:
        return self.max_tokens


class TokenizeRequest(_Body):
    content: str
    add_special: bool = True
    model: str | None = None


class DetokenizeRequest(_Body):
    tokens: list[Annotated[int, Field(ge=0)]]
    model: str | None = None


Body = TypeVar("Body", bound=BaseModel)


def parse(model: type[Body], raw: bytes) -> Body:
    """``raw`` (the request body) as ``model``, else an ApiError 400 that says which field is wrong and how."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise ApiError(400, readable(exc), code=_code(exc), param=_param(exc)) from None


def _loc(error: Any) -> str:
    return ".".join(str(p) for p in error["loc"] if not _is_union_branch(p))


def _is_union_branch(part: object) -> bool:
    """pydantic names the union branch it tried (``str``, ``list[int]``, ``function-after[...]``) in ``loc``."""
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list", "none"})


def _param(exc: ValidationError) -> str | None:
    errors = exc.errors()
    return (_loc(errors[0]) or None) if errors else None


def _code(exc: ValidationError) -> str:
    errors = exc.errors()
    return "invalid_json" if errors and errors[0]["type"] == "json_invalid" else "invalid_value"


def readable(exc: ValidationError) -> str:
    """One sentence per problem (at most 3): ``'max_tokens': expected an integer, found "5"``."""
    errors = exc.errors(include_url=False)
    if errors and errors[0]["type"] == "json_invalid":
        return f"the request body is not valid JSON: {errors[0]['ctx'].get('error', errors[0]['msg'])}"
    if errors and errors[0]["type"] in {"model_type", "model_attributes_type"} and not errors[0]["loc"]:
        return f"the request body must be a JSON object, found {_found(errors[0].get('input'))}"
    by_field: dict[str, Any] = {}
    for e in errors:  # one line per field: each branch of a union complains; a constraint beats a type mismatch
        where = _loc(e) or "body"
        if where not in by_field or (by_field[where]["type"].endswith("_type") and not e["type"].endswith("_type")):
            by_field[where] = e
    lines = [_line(where, e) for where, e in by_field.items()]
    more = f" (and {len(lines) - 3} more)" if len(lines) > 3 else ""
    return "invalid request: " + "; ".join(lines[:3]) + more


def _line(where: str, error: Any) -> str:
    if error["type"] == "missing":
        return f"'{where}' is required"
    msg = str(error["msg"]).removeprefix("Value error, ")
    line = f"'{where}': {msg[0].lower() + msg[1:]}"
    shows_input = error["type"].endswith("_type") or error["type"] in {"literal_error", "enum"}
    return f"{line}, found {_found(error.get('input'))}" if shows_input else line


def _found(value: object) -> str:
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["ChatMessage", "ChatRequest", "CompletionRequest", "DetokenizeRequest", "StreamOptions",
           "TokenizeRequest", "parse", "readable"]
