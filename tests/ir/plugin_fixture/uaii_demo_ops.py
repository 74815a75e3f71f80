"""A tiny op plugin, written as a third-party distribution would ship it.

The plugin tests copy this module into a temporary site directory next to a ``*.dist-info`` that declares it
under the ``uaii.ops`` entry-point group. It uses only the public schema API of uaii.ir.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from uaii.ir.ops import FLOATS, Cost, InferCtx, OpSchema, Param, float_attr
from uaii.ir.shapes import Shape


def _same(ctx: InferCtx) -> Sequence[Shape | None]:
    return [ctx.shape(0)]


SCALE = OpSchema(
    "DemoScale", 1, "Y = X * factor (a plugin op).",
    inputs=(Param("X", "T", "input"),), outputs=(Param("Y", "T", "same shape as X"),),
    attrs=(float_attr("factor", 1.0, "multiplier"),), types={"T": FLOATS}, infer=_same, elementwise=True,
    fusible=True, cost=Cost.LOW, domain="demo")


def register(registry: Any) -> None:
    """The entry point: called with the registry being loaded."""
    registry.register(SCALE)


def schemas() -> list[OpSchema]:
    """The other accepted form: a callable without parameters that returns schemas."""
    return [SCALE]
