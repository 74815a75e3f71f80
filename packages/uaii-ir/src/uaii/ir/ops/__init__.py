"""Built-in op schemas of UAII, one module per family, plus the schema types that plugins use too.

Built-ins reach the registry through :func:`register`, the same call a plugin's ``uaii.ops`` entry point
makes, so a plugin op is never second-class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from uaii.ir.ops import attention, elementwise, fused, index, linalg, logic, moe, movement, norm, reduce, shape_ops
from uaii.ir.ops import nbits as nbits_ops
from uaii.ir.ops import quantized as quantized_ops
from uaii.ir.ops.access import AccessIf, WeightAccess, WeightInput
from uaii.ir.ops.opset import (
    ATTENTION,
    BINARY,
    COMPARE,
    CPP_RUNTIME_OPS,
    ELEMENTWISE,
    GLU,
    GROUPS,
    INDEX,
    LINALG,
    MOE,
    MOVEMENT,
    NORM,
    REDUCE,
    SELECT,
    SHAPE,
    UNARY,
    Op,
)
from uaii.ir.ops.schema import (
    ANY_TYPE,
    FLOATS,
    INDEX_TYPES,
    NUMERIC,
    WEIGHT_TYPES,
    AttrSpec,
    Cost,
    InferCtx,
    InferError,
    OpKind,
    OpSchema,
    Param,
    TensorType,
    bool_attr,
    float_attr,
    int_attr,
    ints_attr,
    str_attr,
)

if TYPE_CHECKING:
    from uaii.ir.registry import Registry

BUILTIN_SCHEMAS: tuple[OpSchema, ...] = (
    *elementwise.SCHEMAS, *linalg.SCHEMAS, *norm.SCHEMAS, *reduce.SCHEMAS, *movement.SCHEMAS, *index.SCHEMAS,
    *attention.SCHEMAS, *moe.SCHEMAS, *logic.SCHEMAS, *shape_ops.SCHEMAS, *nbits_ops.SCHEMAS,
    *quantized_ops.SCHEMAS,
)
FUSED_SCHEMAS: tuple[OpSchema, ...] = fused.SCHEMAS
"""Ops the planner's fusion passes produce (not members of ``Op``); registered with the built-ins."""


def register(registry: Registry) -> None:
    """Register every built-in schema: the ``uaii.ops`` entry point of uaii-ir itself."""
    for schema in (*BUILTIN_SCHEMAS, *FUSED_SCHEMAS):
        registry.register(schema)


__all__ = [
    "ANY_TYPE", "ATTENTION", "BINARY", "BUILTIN_SCHEMAS", "COMPARE", "CPP_RUNTIME_OPS", "ELEMENTWISE", "FLOATS",
    "FUSED_SCHEMAS", "GLU", "GROUPS", "INDEX", "INDEX_TYPES", "LINALG", "MOE", "MOVEMENT", "NORM", "NUMERIC", "REDUCE",
    "SELECT", "SHAPE", "UNARY", "WEIGHT_TYPES", "AccessIf", "AttrSpec", "Cost", "InferCtx", "InferError", "Op",
    "OpKind", "OpSchema", "Param", "TensorType", "WeightAccess", "WeightInput", "bool_attr", "float_attr", "int_attr",
    "ints_attr", "register", "str_attr",
]
