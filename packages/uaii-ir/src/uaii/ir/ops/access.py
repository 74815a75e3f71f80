"""How an op reads a weight operand: a property of its schema, not of the packages that plan or run it.

The planner (what a step stages, what it reads per token), the backends (what they stream and how) and the runtime
(the expert cache) all ask the schema, so none of them keys weight access on op names or input slot numbers.
A schema declares an access per input slot (:attr:`~uaii.ir.ops.schema.OpSchema.weight_access`); undeclared slots
are read :attr:`WeightAccess.WHOLE`. A declaration may depend on the node's attributes (:class:`AccessIf`): a MatMul
streams its weight by output rows only when that weight is stored [N, K].
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from uaii.ir.graph import AttrValue


class WeightAccess(enum.Enum):
    """What part of a weight one execution of the op reads, and so what may be streamed instead of the whole.

    ``WHOLE``: every byte, every time (norm scales, biases; the default).
    ``ROWS``: only the rows (axis 0) the op's index input names: an embedding or gather table. A backend reads each
    looked-up row (one ``pread``); the table is never staged whole for the lookup.
    ``EXPERTS``: a packed expert bank whose axis 0 is the expert; the op reads the ``top_k`` experts (its attribute
    ``top_k``) its router picked, each through its own reference ``#e=N``.
    ``ROW_CHUNKS``: a 2-D weight whose rows are the op's output features (a linear layer stored [N, K]); every row
    is read, but a backend may stream it in chunks of whole rows that fit one staging buffer, each chunk computing
    its own slice of the output.
    """

    WHOLE = "whole"
    ROWS = "rows"
    EXPERTS = "experts"
    ROW_CHUNKS = "row_chunks"


@dataclass(frozen=True)
class AccessIf:
    """``then`` when the node's (resolved) attribute ``attr`` equals ``value``, else ``otherwise``."""

    attr: str
    value: AttrValue
    then: WeightAccess
    otherwise: WeightAccess = WeightAccess.WHOLE

    def resolve(self, attrs: Mapping[str, AttrValue]) -> WeightAccess:
        return self.then if attrs.get(self.attr) == self.value else self.otherwise

    def __str__(self) -> str:
        return f"{self.then.value} if {self.attr} = {self.value!r}, else {self.otherwise.value}"


AccessRule = WeightAccess | AccessIf
"""A slot's declaration: an access, or one chosen by an attribute."""


class WeightInput(NamedTuple):
    """A weight a node reads: its input slot, the value's name and how the op reads it."""

    slot: int
    name: str
    access: WeightAccess


__all__ = ["AccessIf", "AccessRule", "WeightAccess", "WeightInput"]
