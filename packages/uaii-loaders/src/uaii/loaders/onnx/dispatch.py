"""The import dispatch table: (domain, op type, since-version) -> the handler that translates such a node.

A handler is registered once per ONNX op version whose semantics it implements (``@onnx_op("", "Reshape", 13, 14,
19, 21)``). For a node, the importer looks up the op's version at the model's opset — for ai.onnx the
``since_version`` onnx.defs gives for that opset, for other domains (com.microsoft: onnx.defs does not know them)
the model's opset of that domain — and takes the newest handler whose since-version is <= it. For ai.onnx that
handler must have been written for exactly that version: a newer op version than any handler knows is unsupported
rather than translated with older semantics. The table is also what docs/loaders.md's op table is generated from
(:func:`supported_ops`), so the documentation cannot claim an op the importer does not translate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from ..errors import LoaderError

if TYPE_CHECKING:
    from .context import NodeContext
    from .values import Value

AI_ONNX = ""
MS_DOMAIN = "com.microsoft"
MIN_OPSET = 13
"""The oldest ai.onnx opset the importer accepts (the legacy TorchScript exporter writes 14 by default)."""

HandlerResult: TypeAlias = "Value | Sequence[Value | None]"
Handler = Callable[["NodeContext"], HandlerResult]


class OnnxImportError(LoaderError):
    """An ONNX graph that cannot be translated: an unsupported op or opset, or a node whose inputs the IR cannot
    express. Messages name the model file and the node (name, domain, op type, version)."""


@dataclass(frozen=True)
class Registration:
    domain: str  # "" = ai.onnx
    op_type: str
    since: int
    handler: Handler
    doc: str  # first line of the handler's docstring: the IR it becomes, for the generated op table


HANDLERS: dict[tuple[str, str, int], Registration] = {}


def onnx_op(domain: str, op_type: str, *since_versions: int) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of ``op_type`` in ``domain`` ("" = ai.onnx) for each listed since-version.

    List every version whose semantics the handler implements; a version it does not list is unsupported. The
    handler's docstring's first line is shown in the generated op table (say what IR it becomes)."""
    if not since_versions:
        raise ValueError(f"onnx_op({domain!r}, {op_type!r}) needs at least one since-version")

    def deco(fn: Handler) -> Handler:
        doc = (fn.__doc__ or "").strip().splitlines()
        for v in since_versions:
            key = (domain, op_type, v)
            if key in HANDLERS and HANDLERS[key].handler is not fn:
                raise ValueError(f"ONNX op {domain or 'ai.onnx'}::{op_type} version {v} is registered twice")
            HANDLERS[key] = Registration(domain, op_type, v, fn, doc[0].strip() if doc else "")
        return fn

    return deco


def find(domain: str, op_type: str, version: int) -> Registration | None:
    """The newest registration of ``(domain, op_type)`` with since <= ``version``; None if there is none."""
    best: Registration | None = None
    for (d, op, since), reg in HANDLERS.items():
        if d == domain and op == op_type and since <= version and (best is None or since > best.since):
            best = reg
    return best


def resolve(domain: str, op_type: str, since_version: int, *, exact: bool) -> Registration | None:
    """The handler for an op whose version at the model's opset is ``since_version``. ``exact`` (ai.onnx, where
    onnx.defs gives the real since-version): the handler must be registered for that very version."""
    reg = find(domain, op_type, since_version)
    if reg is None or (exact and reg.since != since_version):
        return None
    return reg


def supported_ops() -> list[Registration]:
    """Every registration, sorted by domain, op type and version (the generated op table)."""
    _load_handlers()
    return sorted(HANDLERS.values(), key=lambda r: (r.domain, r.op_type, r.since))


_LOADED = False


def _load_handlers() -> None:
    """Import the handler modules once (they register themselves on import)."""
    global _LOADED
    if _LOADED:
        return
    from . import handlers  # noqa: F401  (imports every ops_*.py and contrib module)

    _LOADED = True


__all__ = ["AI_ONNX", "HANDLERS", "MIN_OPSET", "MS_DOMAIN", "Handler", "HandlerResult", "OnnxImportError",
           "Registration", "find", "onnx_op", "resolve", "supported_ops"]
