"""Op schemas: what an operator accepts, what it produces and how its outputs follow from its inputs.

One :class:`OpSchema` per (op, version), as in ONNX; old versions stay registered beside new ones. A schema
holds typed input/output parameters (optional, variadic), attribute specs with defaults and ranges, type
constraints (type variables such as ``T`` bound to dtype sets: every parameter naming the same variable has
the same dtype), a shape-inference function, and the properties the planner reads (kind, elementwise,
fusible, in-place pairs, cost class, how each weight input is read: :mod:`uaii.ir.ops.access`) — data, never
if-chains in passes.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy as np

from uaii.ir.dtype import FLOAT_TYPES, INTEGER_TYPES, QUANTIZED_TYPES, Dim, DType
from uaii.ir.errors import UaiiError
from uaii.ir.graph import Attribute, AttrType, AttrValue, Node
from uaii.ir.ops.access import AccessIf, AccessRule, WeightAccess, WeightInput
from uaii.ir.shapes import Shape, ShapeError, fmt_shape, normalize_axis, shapes_unify

FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})
"""Activation types of the compute ops."""
NUMERIC = FLOAT_TYPES | INTEGER_TYPES
INDEX_TYPES = frozenset({DType.I32, DType.I64})
WEIGHT_TYPES = FLOATS | QUANTIZED_TYPES
"""A weight operand: an activation type or any GGUF block type (kept packed)."""
ANY_TYPE = frozenset(DType)


class OpKind(enum.Enum):
    """Coarse category of an op; the named sets of :mod:`uaii.ir.ops.opset` follow it."""

    UNARY = "unary"
    BINARY = "binary"
    GLU = "glu"
    LINALG = "linalg"
    NORM = "norm"
    REDUCE = "reduce"
    MOVEMENT = "movement"
    INDEX = "index"
    ATTENTION = "attention"
    MOE = "moe"
    SELECT = "select"
    SHAPE = "shape"
    CUSTOM = "custom"


class Cost(enum.IntEnum):
    """Rough cost class for the planner."""

    FREE = 0  # metadata or a view: no pass over the data
    LOW = 1  # one streaming pass (elementwise)
    MEDIUM = 2  # a few passes or a reduction (norms, softmax, rope, gathers)
    HIGH = 3  # compute-bound: matmul, attention, experts


class TensorType(NamedTuple):
    dtype: DType
    shape: Shape


class InferError(UaiiError):
    """Raised by shape/dtype inference; ``code`` is the validator's diagnostic code."""

    component = "infer"

    def __init__(self, detail: str, code: str = "shape") -> None:
        self.detail = detail
        self.code = code
        super().__init__(detail)


TypeSpec = str | frozenset[DType]


@dataclass(frozen=True)
class Param:
    """An input or output. ``types`` is a type variable of the schema or an explicit dtype set."""

    name: str
    types: TypeSpec
    doc: str = ""
    optional: bool = False
    variadic: bool = False
    min_count: int = 1  # variadic only


@dataclass(frozen=True)
class AttrSpec:
    """An attribute: type, default (None = no default), and the values it admits."""

    name: str
    type: AttrType
    doc: str = ""
    default: AttrValue | None = None
    required: bool = False
    choices: tuple[AttrValue, ...] = ()
    min: float | None = None
    max: float | None = None
    check: Callable[[Any], str | None] | None = None  # extra rule: returns a problem ("is ...; ...") or None

    def coerce(self, a: Attribute) -> AttrValue | None:
        """The value as this spec's type; lossless widenings (int → float, int 0/1 → bool) are accepted."""
        t, v = a.type, a.value
        if t is self.type:
            return v
        if self.type is AttrType.FLOAT and t is AttrType.INT:
            return float(v)  # type: ignore[arg-type]
        if self.type is AttrType.FLOAT_ARRAY and t is AttrType.INT_ARRAY:
            return tuple(float(x) for x in v)  # type: ignore[union-attr]
        if self.type is AttrType.BOOL and t is AttrType.INT and v in (0, 1):
            return bool(v)
        return None

    def range_problem(self, value: AttrValue) -> str | None:
        if self.choices and value not in self.choices:
            return f"is {value!r}; expected one of {', '.join(repr(c) for c in self.choices)}"
        items = value if isinstance(value, tuple) else (value,)
        for x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue
            if self.min is not None and x < self.min:
                return f"is {value!r}; values must be >= {self.min:g}"
            if self.max is not None and x > self.max:
                return f"is {value!r}; values must be <= {self.max:g}"
        return self.check(value) if self.check is not None else None

    def describe_range(self) -> str:
        if self.choices:
            return " | ".join(str(c) for c in self.choices)
        lo = "" if self.min is None else f">= {self.min:g}"
        hi = "" if self.max is None else f"<= {self.max:g}"
        return ", ".join(x for x in (lo, hi) if x)


def _spec(kind: AttrType, name: str, default: Any, doc: str, **kw: Any) -> AttrSpec:
    return AttrSpec(name, kind, doc, default, **kw)


def int_attr(name: str, default: int | None, doc: str, **kw: Any) -> AttrSpec:
    return _spec(AttrType.INT, name, default, doc, **kw)


def float_attr(name: str, default: float | None, doc: str, **kw: Any) -> AttrSpec:
    return _spec(AttrType.FLOAT, name, default, doc, **kw)


def bool_attr(name: str, default: bool | None, doc: str, **kw: Any) -> AttrSpec:
    return _spec(AttrType.BOOL, name, default, doc, **kw)


def str_attr(name: str, default: str | None, doc: str, **kw: Any) -> AttrSpec:
    return _spec(AttrType.STRING, name, default, doc, **kw)


def ints_attr(name: str, default: tuple[int, ...] | None, doc: str, **kw: Any) -> AttrSpec:
    return _spec(AttrType.INT_ARRAY, name, default, doc, **kw)


def positive(value: Any) -> str | None:
    """An ``AttrSpec.check`` for floats that must be > 0."""
    return None if value > 0 else f"is {value!r}; must be > 0"


ShapeFn = Callable[["InferCtx"], Sequence[Shape | None]]
"""Returns one shape (or None = unknown) per output slot of the node."""
DTypeFn = Callable[["InferCtx"], Sequence[DType | None]]
"""Returns the exact dtype expected per output slot where the type constraints alone do not fix it."""


@dataclass(frozen=True)
class OpSchema:
    """One (op, version). See the module docstring; ``doc`` is rendered into docs/ops.md."""

    op: str
    version: int
    doc: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    attrs: tuple[AttrSpec, ...] = ()
    types: Mapping[str, frozenset[DType]] | tuple[tuple[str, frozenset[DType]], ...] = ()
    infer: ShapeFn | None = None
    dtypes: DTypeFn | None = None
    kind: OpKind = OpKind.CUSTOM
    elementwise: bool = False
    fusible: bool = False
    inplace: tuple[tuple[int, int], ...] = ()  # (input slot, output slot) pairs that may share one buffer
    cost: Cost = Cost.LOW
    domain: str = "uaii"
    weight_access: Mapping[int, AccessRule] | tuple[tuple[int, AccessRule], ...] = ()
    """Input slot → how the op reads a weight there (undeclared: WHOLE); a variadic last input's slot covers all
    of its slots. The planner, the backends and the runtime read it through :meth:`weight_inputs`."""
    value_inputs: tuple[int, ...] = ()
    """Input slots whose *values* (not only shapes) fix the output shapes (Reshape's shape, Range's bounds): a backend
    must know them when it binds the node, so it computes what they depend on ahead (see :attr:`from_shape`)."""
    from_shape: bool = False
    """The outputs depend on the inputs' shapes only, never on their values (Shape): a backend knows them as soon as
    it knows the shapes, without running anything."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", str(self.op))  # an Op member becomes its plain name
        pairs = self.types.items() if isinstance(self.types, Mapping) else self.types
        object.__setattr__(self, "types", tuple(sorted(pairs)))
        access = self.weight_access.items() if isinstance(self.weight_access, Mapping) else self.weight_access
        object.__setattr__(self, "weight_access",
                           tuple(sorted(access, key=lambda kv: kv[0] if isinstance(kv[0], int) else -1)))
        where = f"schema {self.op!r} v{self.version}"
        if not self.op or not isinstance(self.version, int) or self.version < 1:
            raise UaiiError(f"[registry] {where}: needs an op name and a version >= 1")
        for group in (self.inputs, self.outputs):
            _check_params(group, self.type_map, where)
        names = [a.name for a in self.attrs]
        if len(names) != len(set(names)):
            raise UaiiError(f"[registry] {where}: duplicate attribute names")
        for a in self.attrs:
            if a.default is not None and (a.coerce(Attribute(a.type, a.default)) is None
                                          or a.range_problem(a.default)):
                raise UaiiError(f"[registry] {where}: default of attribute {a.name!r} is invalid")
        _check_access(self, where)
        bad = [i for i in self.value_inputs if not isinstance(i, int) or not 0 <= i < len(self.inputs)]
        if bad:
            raise UaiiError(f"[registry] {where}: value_inputs {bad} name input slots the schema does not have "
                            f"({len(self.inputs)} inputs)")

    # --- lookups -------------------------------------------------------------------------------------------
    @property
    def key(self) -> tuple[str, int]:
        return self.op, self.version

    @property
    def type_map(self) -> dict[str, frozenset[DType]]:
        return dict(self.types)

    @property
    def access_map(self) -> dict[int, AccessRule]:
        """The declared weight access per input slot (slot order)."""
        return dict(self.weight_access)

    def attr_spec(self, name: str) -> AttrSpec | None:
        return next((a for a in self.attrs if a.name == name), None)

    def allowed(self, p: Param) -> frozenset[DType]:
        return self.type_map[p.types] if isinstance(p.types, str) else p.types

    @staticmethod
    def arity(params: Sequence[Param]) -> tuple[int, int | None]:
        """(min, max) number of slots; max is None when the last parameter is variadic."""
        lo = sum(p.min_count if p.variadic else 1 for p in params if not p.optional)
        if params and params[-1].variadic:
            return lo, None
        return lo, len(params)

    @staticmethod
    def param_at(params: Sequence[Param], slot: int) -> Param | None:
        if slot < len(params):
            return params[slot]
        return params[-1] if params and params[-1].variadic else None

    # --- weight access -------------------------------------------------------------------------------------
    def access(self, slot: int, attrs: Mapping[str, AttrValue] | None = None) -> WeightAccess:
        """How input ``slot`` is read when it holds a weight, for a node with the resolved ``attrs``."""
        variadic = bool(self.inputs) and self.inputs[-1].variadic
        rule = self.access_map.get(min(slot, len(self.inputs) - 1) if variadic else slot)
        if rule is None:
            return WeightAccess.WHOLE
        return rule if isinstance(rule, WeightAccess) else rule.resolve(attrs or {})

    def weight_inputs(self, node: Node, weights: Container[str], attrs: Mapping[str, AttrValue] | None = None, *,
                      access: WeightAccess | None = None) -> list[WeightInput]:
        """The inputs of ``node`` that are weights (their names are in ``weights``), in slot order, each with how
        this op reads it. ``attrs``: the node's resolved attributes when the caller has them (else resolved here);
        ``access``: only the inputs read that way (the expert banks, the tables read by rows) — what most callers
        want, so that none filters by hand."""
        found = [(i, v) for i, v in enumerate(node.inputs) if v and v in weights]
        if not found:
            return []
        values = attrs if attrs is not None else self.resolve_attrs(node)[0]
        reads = [WeightInput(i, v, self.access(i, values)) for i, v in found]
        return reads if access is None else [w for w in reads if w.access is access]

    # --- node checks (used by the validator and by passes that build nodes) --------------------------------
    def check_arity(self, node: Node) -> list[str]:
        out: list[str] = []
        for what, params, slots in (("input", self.inputs, node.inputs),
                                    ("output", self.outputs, node.outputs)):
            lo, hi = self.arity(params)
            if len(slots) < lo or (hi is not None and len(slots) > hi):
                want = f"{lo}" if lo == hi else f"{lo}..{'' if hi is None else hi}"
                out.append(f"takes {want} {what}s, found {len(slots)}")
                continue
            for i, name in enumerate(slots):
                p = self.param_at(params, i)
                if not name and p is not None and (p.variadic or not p.optional):
                    out.append(f"{what} #{i} ({p.name!r}) is required but empty")
        return out

    def resolve_attrs(self, node: Node) -> tuple[dict[str, AttrValue], list[tuple[str, str]]]:
        """Attribute values with defaults filled in, and (code, message) problems."""
        values: dict[str, AttrValue] = {}
        problems: list[tuple[str, str]] = []
        for key, a in node.attributes:
            spec = self.attr_spec(key)
            if spec is None:
                known = ", ".join(s.name for s in self.attrs) or "none"
                problems.append(("attr-unknown", f"unknown attribute {key!r} (known: {known})"))
                continue
            v = spec.coerce(a)
            if v is None:
                problems.append(("attr-type", f"attribute {key!r} is {a.type.value} {a.value!r}; "
                                              f"expected {spec.type.value}"))
                continue
            bad = spec.range_problem(v)
            if bad:
                problems.append(("attr-range", f"attribute {key!r} {bad}"))
                continue
            values[key] = v
        for spec in self.attrs:
            if spec.name in values or spec.name in node.attrs:
                continue
            if spec.required:
                problems.append(("attr-missing", f"required attribute {spec.name!r} ({spec.type.value}) "
                                                 "is missing"))
            elif spec.default is not None:
                values[spec.name] = spec.default
        return values, problems

    def check_dtypes(self, ins: Sequence[DType | None], outs: Sequence[DType | None]) -> list[str]:
        """Type-constraint problems; None entries (omitted or unknown) are skipped."""
        bound: dict[str, tuple[DType, str]] = {}
        out: list[str] = []
        for what, params, dts in (("input", self.inputs, ins), ("output", self.outputs, outs)):
            for i, dt in enumerate(dts):
                p = self.param_at(params, i)
                if dt is None or p is None:
                    continue
                where = f"{what} #{i} ({p.name!r})"
                allowed = self.allowed(p)
                if dt not in allowed:
                    out.append(f"{where} has dtype {dt.value}; expected {fmt_types(allowed)}")
                elif isinstance(p.types, str):
                    prev = bound.setdefault(p.types, (dt, where))
                    if prev[0] is not dt:
                        out.append(f"{where} has dtype {dt.value} but {prev[1]} has {prev[0].value}; "
                                   f"both are type {p.types}")
        return out


def _check_params(params: Sequence[Param], types: Mapping[str, frozenset[DType]], where: str) -> None:
    seen_optional = False
    for i, p in enumerate(params):
        if isinstance(p.types, str) and p.types not in types:
            raise UaiiError(f"[registry] {where}: parameter {p.name!r} uses undeclared type {p.types!r}")
        if p.variadic and i != len(params) - 1:
            raise UaiiError(f"[registry] {where}: only the last parameter may be variadic")
        if seen_optional and not p.optional and not p.variadic:
            raise UaiiError(f"[registry] {where}: required parameter {p.name!r} follows an optional one")
        seen_optional = seen_optional or p.optional


def _check_access(schema: OpSchema, where: str) -> None:
    """Weight-access declarations name existing input slots and attributes; EXPERTS needs a ``top_k`` to read."""
    for slot, rule in schema.access_map.items():
        if not isinstance(slot, int) or not 0 <= slot < len(schema.inputs):
            raise UaiiError(f"[registry] {where}: weight access declared for input slot {slot!r}, which the schema "
                            f"does not have ({len(schema.inputs)} inputs)")
        if not isinstance(rule, (WeightAccess, AccessIf)):
            raise UaiiError(f"[registry] {where}: weight access of input slot {slot} is {rule!r}; expected a "
                            "WeightAccess or an AccessIf")
        if isinstance(rule, AccessIf) and schema.attr_spec(rule.attr) is None:
            raise UaiiError(f"[registry] {where}: weight access of input slot {slot} depends on attribute "
                            f"{rule.attr!r}, which the schema does not declare")
        options = (rule,) if isinstance(rule, WeightAccess) else (rule.then, rule.otherwise)
        top_k = schema.attr_spec("top_k")
        if WeightAccess.EXPERTS in options and (top_k is None or top_k.type is not AttrType.INT):
            raise UaiiError(f"[registry] {where}: input slot {slot} is read by EXPERTS, which needs an int "
                            "attribute 'top_k' (the experts read per token)")


def fmt_types(types: frozenset[DType]) -> str:
    """``f32, f16 or any block-quantized type`` — short enough for a message."""
    parts = sorted(d.value for d in types - QUANTIZED_TYPES)
    if types >= QUANTIZED_TYPES:
        parts.append("any block-quantized type")
    else:
        parts += sorted(d.value for d in types & QUANTIZED_TYPES)
    if len(parts) < 2:
        return parts[0] if parts else "nothing"
    return ", ".join(parts[:-1]) + " or " + parts[-1]


class InferCtx:
    """What a shape or dtype function sees: the node, its input types, resolved attributes, constants."""

    def __init__(self, node: Node, schema: OpSchema, inputs: Sequence[TensorType | None],
                 attrs: Mapping[str, AttrValue], consts: Mapping[int, np.ndarray] | None = None) -> None:
        self.node = node
        self.schema = schema
        self.inputs = tuple(inputs)
        self.attrs = dict(attrs)
        self.consts = dict(consts or {})
        self.n_outputs = len(node.outputs)
        self._counter = itertools.count()

    def has(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def type(self, i: int) -> TensorType:
        t = self.inputs[i] if i < len(self.inputs) else None
        if t is None:
            raise InferError(f"input #{i} is missing", "arity")
        return t

    def shape(self, i: int) -> Shape:
        return self.type(i).shape

    def dtype(self, i: int) -> DType:
        return self.type(i).dtype

    def has_output(self, i: int) -> bool:
        return i < self.n_outputs and bool(self.node.outputs[i])

    def attr(self, name: str) -> Any:
        return self.attrs.get(name)

    def const(self, i: int) -> np.ndarray | None:
        return self.consts.get(i)

    def fail(self, detail: str, code: str = "shape") -> NoReturn:
        raise InferError(detail, code)

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        try:
            return normalize_axis(axis, rank)
        except ShapeError:
            self.fail(f"{what} {axis} is out of range for a rank-{rank} input", "attr-range")

    def rank(self, i: int, lo: int, hi: int | None = None) -> Shape:
        """Input ``i``'s shape, after checking its rank is within [lo, hi]."""
        s = self.shape(i)
        if len(s) < lo or (hi is not None and len(s) > hi):
            p = self.schema.param_at(self.schema.inputs, i)
            want = f">= {lo}" if hi is None else (f"{lo}" if lo == hi else f"{lo}..{hi}")
            self.fail(f"input #{i} ({p.name if p else '?'!r}) must have rank {want}, found shape {list(s)}")
        return s

    def expect(self, i: int, want: Sequence[Dim], what: str) -> None:
        """Fail unless input ``i`` has exactly the shape ``want`` (symbolic dims unify), naming it ``what``."""
        got = self.shape(i)
        if not shapes_unify(got, want):
            self.fail(f"{what} must have shape {fmt_shape(want)}, found {fmt_shape(got)}")

    def fresh(self, hint: str = "d") -> str:
        """A new symbolic dim, unique within this node."""
        safe = "".join(c if c.isalnum() else "_" for c in self.node.name) or "node"
        return f"{hint}_{safe}_{next(self._counter)}"


__all__ = [
    "ANY_TYPE",
    "FLOATS",
    "INDEX_TYPES",
    "NUMERIC",
    "WEIGHT_TYPES",
    "AccessIf",
    "AccessRule",
    "AttrSpec",
    "Cost",
    "DTypeFn",
    "InferCtx",
    "InferError",
    "OpKind",
    "OpSchema",
    "Param",
    "ShapeFn",
    "TensorType",
    "TypeSpec",
    "WeightAccess",
    "WeightInput",
    "bool_attr",
    "float_attr",
    "fmt_types",
    "int_attr",
    "ints_attr",
    "positive",
    "str_attr",
]
