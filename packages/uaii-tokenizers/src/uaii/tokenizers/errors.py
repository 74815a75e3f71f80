"""Errors of uaii.tokenizers: every failure is a `UaiiError` whose message starts with ``[tokenizer]``."""

from __future__ import annotations

from uaii.ir.errors import FormatError, UaiiError


class TokenizerError(UaiiError):
    """A tokenizer cannot be found, built or used: unknown model kind, missing file, bad template."""

    component = "tokenizer"


class TokenizerFormatError(FormatError):
    """A tokenizer file could not be decoded: names the file and, where the format gives one, the byte offset."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        super().__init__(message, path=path, offset=offset, component="tokenizer")


class ChatTemplateError(TokenizerError):
    """A chat template failed to compile or render (including sandbox violations and `raise_exception`)."""
