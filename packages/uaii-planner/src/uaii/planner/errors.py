"""Errors of uaii-planner: each is a :class:`PlannerError` (a ``UaiiError``) that says what was expected."""

from __future__ import annotations

from collections.abc import Mapping

from uaii.ir.errors import UaiiError


class PlannerError(UaiiError):
    """A graph or an option set cannot be planned: an unknown pass, an unbound symbolic dim, a bad option."""

    component = "planner"


class BudgetError(PlannerError):
    """The memory budget cannot hold even the minimum: staging buffers + activation arena + KV cache.

    ``parts`` maps each item that counts against the budget to its bytes, so tools can show the breakdown.
    """

    def __init__(self, message: str, *, budget_bytes: int, required_bytes: int,
                 parts: Mapping[str, int]) -> None:
        self.budget_bytes = budget_bytes
        self.required_bytes = required_bytes
        self.parts = dict(parts)
        super().__init__(message)


__all__ = ["BudgetError", "PlannerError"]
