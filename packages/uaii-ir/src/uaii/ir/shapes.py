"""Symbolic shape arithmetic for shape inference.

A dimension is an ``int`` or a symbolic name (``"seq"``, ``"past"``). The rules are deliberately few:

* two dims are *compatible* when equal or when either is symbolic (a symbol may take any value at run time);
* a mismatch is reported only where it is provable: two different ints;
* arithmetic folds ints and identities (``x + 0``, ``x * 1``, ``x / x``) and otherwise builds a new symbolic
  expression. Expressions are identifier-safe strings (``past_plus_seq``, ``heads_times_64``) so an inferred
  shape can be stored in a :class:`~uaii.ir.graph.Tensor` as it is; commutative operands are sorted, so
  ``seq + past`` and ``past + seq`` give the same name.

Shapes are compared after dropping leading dimensions equal to 1 (the *batch-1 rule*): ``[1, seq, 64]`` and
``[seq, 64]`` describe the same memory layout, and the C++ runtime's files declare batch-1 values either way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from uaii.ir.dtype import Dim
from uaii.ir.errors import UaiiError

Shape = tuple[Dim, ...]


class ShapeError(UaiiError):
    """Shapes that provably cannot fit together (two different ints where equal ones are needed)."""

    component = "shape"


def fmt_shape(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def dims_compatible(a: Dim, b: Dim) -> bool:
    """Equal, or at least one side symbolic."""
    return a == b or isinstance(a, str) or isinstance(b, str)


def strip_leading_ones(shape: Sequence[Dim]) -> Shape:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return tuple(shape[i:])


def shapes_compatible(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Same rank (after the batch-1 rule) and every pair of dims compatible."""
    if len(a) == len(b) and all(dims_compatible(x, y) for x, y in zip(a, b, strict=True)):
        return True
    sa, sb = strip_leading_ones(a), strip_leading_ones(b)
    return len(sa) == len(sb) and all(dims_compatible(x, y) for x, y in zip(sa, sb, strict=True))


def unify(a: Dim, b: Dim, what: str = "dimensions") -> Dim:
    """The more concrete of two dims that must be equal; raises when they are two different ints."""
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            raise ShapeError(f"{what} differ: {a} vs {b}")
        return a
    return a if isinstance(a, int) else b


def shapes_unify(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """Whether two shapes can be the same: one rank, and every pair of dims unifies (a symbol matches anything)."""
    try:
        if len(a) != len(b):
            return False
        for x, y in zip(a, b, strict=True):
            unify(x, y)
    except ShapeError:
        return False
    return True


def _expr(op: str, a: Dim, b: Dim, commutative: bool) -> str:
    """``a_op_b`` as an identifier: commutative operands sorted symbols first, a leading digit escaped."""
    x, y = a, b
    if commutative and (isinstance(x, int), str(x)) > (isinstance(y, int), str(y)):
        x, y = y, x
    text = f"{x}_{op}_{y}"
    return "_" + text if text[0].isdigit() else text


def dim_add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    if b == 0:
        return a
    return _expr("plus", a, b, True)


def dim_sub(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        if a < b:
            raise ShapeError(f"dimension {a} - {b} is negative")
        return a - b
    if b == 0:
        return a
    if a == b:
        return 0
    return _expr("minus", a, b, False)


def dim_mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if a == 1:
        return b
    if b == 1:
        return a
    if a == 0 or b == 0:
        return 0
    return _expr("times", a, b, True)


def dim_div(a: Dim, b: Dim) -> Dim:
    """Exact division; two ints that do not divide raise."""
    if isinstance(a, int) and isinstance(b, int):
        if b == 0 or a % b:
            raise ShapeError(f"dimension {a} is not divisible by {b}")
        return a // b
    if b == 1:
        return a
    if a == b:
        return 1
    return _expr("div", a, b, False)


def dim_prod(dims: Sequence[Dim]) -> Dim:
    """Product with the ints folded into one factor and the symbols sorted."""
    coef, syms = _factors(dims)
    out: Dim = coef
    for s in sorted(syms.elements()):
        out = dim_mul(out, s) if out != 1 else s
    return out


def _factors(dims: Sequence[Dim]) -> tuple[int, Counter[str]]:
    ints = [d for d in dims if isinstance(d, int)]
    return math.prod(ints), Counter(d for d in dims if isinstance(d, str))


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """NumPy broadcasting of one dim pair; two different symbols give ``a_max_b``."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise ShapeError(f"dimensions {a} and {b} do not broadcast")
    if isinstance(a, int):
        return a  # the symbol must be 1 or a
    if isinstance(b, int):
        return b
    return _expr("max", a, b, True)


def broadcast_shapes(*shapes: Sequence[Dim]) -> Shape:
    """NumPy broadcasting of several shapes (right-aligned)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        for i, d in enumerate(s):
            j = rank - len(s) + i
            try:
                out[j] = broadcast_dim(out[j], d)
            except ShapeError:
                raise ShapeError(f"shapes {', '.join(fmt_shape(x) for x in shapes)} do not broadcast "
                                 f"(axis {j - rank})") from None
    return tuple(out)


def normalize_axis(axis: int, rank: int) -> int:
    """``axis`` in ``[-rank, rank)`` mapped to ``[0, rank)``; raises otherwise."""
    if not -rank <= axis < rank:
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def quotient(num: Sequence[Dim], den: Sequence[Dim]) -> Dim:
    """``prod(num) / prod(den)`` with common symbols cancelled; raises where provably not whole."""
    ncoef, nsyms = _factors(num)
    dcoef, dsyms = _factors(den)
    common = nsyms & dsyms
    nsyms, dsyms = nsyms - common, dsyms - common
    if dsyms or dcoef == 0:
        return dim_div(dim_prod([ncoef, *nsyms.elements()]), dim_prod([dcoef, *dsyms.elements()]))
    if ncoef % dcoef:
        if not nsyms:
            raise ShapeError(f"{ncoef} elements cannot be split into parts of {dcoef}")
        return dim_div(dim_prod([ncoef, *nsyms.elements()]), dcoef)
    return dim_prod([ncoef // dcoef, *nsyms.elements()])


def reshape_shape(shape: Sequence[Dim], target: Sequence[int]) -> Shape:
    """Output shape of a reshape: ``0`` copies the input dim at that position, ``-1`` is inferred."""
    out: list[Dim] = []
    infer_at = -1
    for i, t in enumerate(target):
        if t == 0:
            if i >= len(shape):
                raise ShapeError(f"target {list(target)}: 0 at position {i} copies a dimension that the "
                                 f"rank-{len(shape)} input does not have")
            out.append(shape[i])
        elif t == -1:
            if infer_at >= 0:
                raise ShapeError(f"target {list(target)} has more than one -1")
            infer_at = i
            out.append(1)
        elif t < -1:
            raise ShapeError(f"target {list(target)} has a negative size {t}")
        else:
            out.append(t)
    if infer_at >= 0:
        out[infer_at] = quotient(shape, out[:infer_at] + out[infer_at + 1:])
    elif not same_size(shape, out):
        raise ShapeError(f"cannot reshape {fmt_shape(shape)} to {list(target)}: the element counts differ")
    return tuple(out)


def same_size(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    """False only where the element counts provably differ (same symbols, different int factors)."""
    acoef, asyms = _factors(a)
    bcoef, bsyms = _factors(b)
    return asyms != bsyms or acoef == bcoef
