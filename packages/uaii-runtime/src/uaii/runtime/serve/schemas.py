"""Request bodies of the OpenAI-compatible routes as pydantic models, and pydantic's complaints made readable.

Strict types (``"max_tokens": "5"`` is refused, as is ``"stream": 1``), unknown fields ignored (clients send
extras: ``user``, ``frequency_penalty: 0``, ``logit_bias``, ``tools`` ...), and ``null`` for an optional field is
its default (clients serialize unset fields as null: ``"stream": null``, ``"echo": null``). Every failure becomes
one 400 ``invalid_request_error`` naming the field, what was expected and what was found (:func:`parse`); what
OpenAI accepts but this server cannot do (``response_format`` json, ``tool_choice`` "required", image parts) is a
400 ``unsupported_parameter`` naming the field, never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ApiError

MAX_STOP = 4  # stop sequences per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20  # chat top_logprobs (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs (OpenAI's limit)

Stop = str | Annotated[list[str], Field(max_length=MAX_STOP)] | None


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """``null`` for a field that has a default means the default (openai-python and LangChain send unset
        fields as null); a required field stays required."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}


class StreamOptions(_Body):
    include_usage: bool = False


class ContentPart(_Body):
    """One part of a message's content. Only ``text`` parts are served; another type (``image_url``,
    ``input_audio``) is refused by :func:`check_chat` with the part's place, not by a type mismatch here."""

    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class _Generation(_Body):
    """The fields chat and completions share."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    max_tokens: int | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None  # 0: the top token only
    seed: int | None = None  # negative: a fresh random seed (llama.cpp's -1)
    n: int | None = None
    ignore_eos: bool = False  # llama-server's extension: generate max_tokens whatever the model says
    response_format: dict[str, Any] | None = None  # only {"type": "text"}
    tool_choice: str | dict[str, Any] | None = None  # tools are ignored: only "none"/"auto" (nothing is called)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int | None:
        if n is not None and n != 1:
            raise ValueError("only n=1 is supported (this server generates one choice per request)")
        return n

    @model_validator(mode="after")
    def _served(self) -> _Generation:
        """OpenAI's fields this server cannot honour are refused by name (code ``unsupported_parameter``)."""
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise ApiError(400, f"'response_format' {kind!r} is not supported; only {{'type': 'text'}} (free text)",
                           code="unsupported_parameter", param="response_format")
        if self.tool_choice not in (None, "none", "auto"):
            shown = self.tool_choice if isinstance(self.tool_choice, str) else "a named function"
            raise ApiError(400, f"'tool_choice' {shown!r} is not supported: this server does not call tools "
                                "('tools' are ignored; tool_choice may be 'none' or 'auto')",
                           code="unsupported_parameter", param="tool_choice")
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")
        return self

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

    @model_validator(mode="after")
    def _text_parts_only(self) -> ChatRequest:
        for i, message in enumerate(self.messages):
            for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
                where = f"messages.{i}.content.{j}"
                if part.type != "text":
                    raise ApiError(400, f"'{where}' is a {part.type!r} part; only text content parts are supported",
                                   code="unsupported_parameter", param=where)
                if part.text is None:
                    raise ApiError(400, f"'{where}.text' is required in a text part", param=f"{where}.text")
        return self


class CompletionRequest(_Generation):
    prompt: str | list[int] | list[str] | list[list[int]]
    suffix: str | None = None
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: bool = False

    def token_limit(self) -> int | None:
        return self.max_tokens

    def one_prompt(self) -> str | list[int]:
        """The prompt: a text or token ids, unpacked from a list of one (a list of several is a 400)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ApiError(400, f"one prompt per request is supported, found a list of {len(prompt)}",
                               param="prompt")
            return cast(str | list[int], prompt[0])
        return cast(str | list[int], prompt)


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
    if error["type"] == "finite_number":
        return f"'{where}' must be a finite number, found {error.get('input')!r}"
    msg = str(error["msg"]).removeprefix("Value error, ")
    line = f"'{where}': {msg[0].lower() + msg[1:]}"
    shows_input = error["type"].endswith("_type") or error["type"] in {"literal_error", "enum"}
    return f"{line}, found {_found(error.get('input'))}" if shows_input else line


def _found(value: object) -> str:
    text = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["ChatMessage", "ChatRequest", "CompletionRequest", "DetokenizeRequest", "StreamOptions",
           "TokenizeRequest", "parse", "readable"]
