"""Errors of uaii-runtime: :class:`SessionError` (misuse, bad options, context overflow) is a ``UaiiError``."""

from __future__ import annotations

from uaii.ir import UaiiError


class SessionError(UaiiError):
    """The Session cannot do what was asked: a bad option, a closed session, a prompt longer than the context."""

    component = "runtime"


__all__ = ["SessionError"]
