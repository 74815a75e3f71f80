"""Fusion passes: named functions Graph → Graph, run in registry order unless the options name an order.

Every pass returns a new graph (or the same object when nothing matched) and never mutates its input. A pass is
any callable ``fn(graph, registry=None) -> Graph``; :func:`register_pass` adds one under a name so that
:class:`~uaii.planner.options.PlannerOptions` can enable, disable and order passes by name.

Built-in passes, in default order:

* ``glu`` — ``Mul(Silu(a), b)`` → ``SwiGLU(a, b)``, ``Mul(Gelu(a), b)`` → ``GeGLU(a, b)``;
* ``add_rms_norm`` — ``RMSNorm(Add(a, b))`` → ``AddRMSNorm(a, b)`` (outputs: normalized value, sum);
* ``grouped_matmul`` — MatMuls sharing an input (Q/K/V, gate/up) → one ``GroupedMatMul``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from uaii.ir.graph import Graph
from uaii.ir.registry import Registry
from uaii.planner.errors import PlannerError
from uaii.planner.passes.add_norm import NORM_OF_ADD, fuse_add_norm
from uaii.planner.passes.glu import GLU_OF_ACTIVATION, fuse_glu
from uaii.planner.passes.grouped_matmul import fuse_grouped_matmul
from uaii.planner.passes.rewrite import Rewrite

PassFn = Callable[..., Graph]
"""``fn(graph, registry=None) -> Graph``."""


@dataclass(frozen=True)
class FusionPass:
    """A registered pass: its name, function, one-line description and whether it runs by default."""

    name: str
    fn: PassFn
    doc: str
    default: bool = True

    def __call__(self, graph: Graph, registry: Registry | None = None) -> Graph:
        return self.fn(graph, registry)


_PASSES: dict[str, FusionPass] = {}


def register_pass(name: str, fn: PassFn, doc: str = "", *, default: bool = True,
                  replace: bool = False) -> FusionPass:
    """Add a pass under ``name`` (after the existing ones in default order); ``replace`` to redefine one."""
    if not name or not name.replace("_", "").isalnum():
        raise PlannerError(f"pass name must be a non-empty identifier, found {name!r}")
    if name in _PASSES and not replace:
        raise PlannerError(f"a fusion pass named {name!r} is already registered")
    if not doc and fn.__doc__:
        doc = fn.__doc__.strip().splitlines()[0]
    p = FusionPass(name, fn, doc, default)
    _PASSES[name] = p
    return p


def unregister_pass(name: str) -> None:
    _PASSES.pop(name, None)


def get_pass(name: str) -> FusionPass:
    try:
        return _PASSES[name]
    except KeyError:
        raise PlannerError(f"unknown fusion pass {name!r}; registered passes: "
                           f"{', '.join(_PASSES) or 'none'}") from None


def available_passes() -> tuple[str, ...]:
    """Every registered pass name, in registry order."""
    return tuple(_PASSES)


def default_passes() -> tuple[str, ...]:
    """The passes that run when the options name none."""
    return tuple(n for n, p in _PASSES.items() if p.default)


def run_passes(graph: Graph, names: Sequence[str] | None = None, registry: Registry | None = None) -> Graph:
    """Run ``names`` (default: :func:`default_passes`) in order; unknown names raise before any pass runs."""
    passes = [get_pass(n) for n in (default_passes() if names is None else names)]
    for p in passes:
        graph = p(graph, registry)
    return graph


register_pass("glu", fuse_glu, "Mul(Silu(a), b) -> SwiGLU(a, b); Mul(Gelu(a), b) -> GeGLU(a, b)")
register_pass("add_rms_norm", fuse_add_norm, "RMSNorm(Add(a, b)) -> AddRMSNorm(a, b): normalized value and sum")
register_pass("grouped_matmul", fuse_grouped_matmul,
              "MatMuls sharing one input and weight dtype (Q/K/V, gate/up) -> one GroupedMatMul")

__all__ = ["GLU_OF_ACTIVATION", "NORM_OF_ADD", "FusionPass", "PassFn", "Rewrite", "available_passes",
           "default_passes", "fuse_add_norm", "fuse_glu", "fuse_grouped_matmul", "get_pass", "register_pass",
           "run_passes", "unregister_pass"]
