"""What the importer knows about one ONNX value while it translates a graph.

An ONNX value becomes one of three things, and a handler must be able to tell which without caring how it got
there: a *runtime* IR tensor (dtype + shape whose dims are ints or symbols), a *folded constant* (a numpy array
computed at load time), or a *symbolic vector* (a 1-D int64 value whose elements are dims — what ``Shape`` and the
arithmetic on its result give; ``[batch, seq, 64]``). Initializers are runtime tensors marked ``weight``: their
bytes stay in the file and are read by the storage layer, never here (a handler that needs a small initializer's
numbers asks the context for them). A constant or a symbolic vector is placed in the IR graph only when a runtime
op consumes it (the builder materializes it then), so shape arithmetic that folds away leaves nothing behind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from uaii.ir import Dim, DType
from uaii.ir.reference import f32_to_bf16

_NOT_IDENT = re.compile(r"[^0-9A-Za-z_]")
GENERATED = re.compile(r"_(?:plus|minus|times|div|max|min)_|_[0-9]+$|^_|^[0-9]")
"""What every symbol the importer or uaii.ir makes up has and no ONNX dim_param symbol may have: an arithmetic
infix (uaii.ir.shapes' ``past_plus_seq``, ``a_max_b``; the importer's ``a_min_b``), a counter at the end (fresh
symbols: ``range_7``, ``x_dim0_3``, uaii.ir's ``fill_node_1``) or a leading ``_`` / digit."""


def sanitize_symbol(name: str) -> str:
    """An ONNX ``dim_param`` as an IR symbolic dim: an identifier that no generated symbol can equal.

    Other characters than letters, digits and ``_`` become ``_`` (``"sequence length"`` -> ``sequence_length``).
    Then whatever would make it look like a generated symbol (:data:`GENERATED`) is taken out, because symbols
    are compared by name: a dim_param ``a_plus_b`` must not be mistaken for the sum of the dims ``a`` and ``b``
    (Equal would fold to true). The ``_`` before an arithmetic word or a trailing number goes, a leading ``_``
    goes, a leading digit (or an empty name) gets a ``d`` prefix: ``"past_sequence_length + 1"`` ->
    ``past_sequence_length1``, ``"a_plus_b"`` -> ``a_plusb``, ``"2"`` -> ``d2``."""
    text = _NOT_IDENT.sub("_", name)
    while True:
        m = GENERATED.search(text) if text else None
        if not text:
            return "d"
        if m is None:
            return text
        hit = m.group(0)
        if hit[0].isdigit():  # a leading digit
            text = "d" + text
        elif hit == "_":  # a leading underscore
            text = text[1:]
        elif hit.endswith("_"):  # an arithmetic infix: its trailing underscore goes
            text = text[:m.end() - 1] + text[m.end():]
        else:  # a trailing counter: the underscore before it goes
            text = text[:m.start()] + hit[1:]


def scalar(value: float | int | bool, dtype: DType) -> np.ndarray:
    """``value`` as a 0-d array of the IR dtype ``dtype`` in its stored form: bf16 as its (rounded) word, an
    integer or bool type exactly. The one way handlers build the constants of their decompositions (a float
    literal's ``np.asarray(v, DType.BF16.numpy)`` would be the integer v as a raw word, not v)."""
    if dtype is DType.BF16:
        return f32_to_bf16(np.asarray(value, np.float32)).reshape(())
    if dtype.is_quantized:
        raise ValueError(f"no scalar of the block-quantized type {dtype.value}")
    return np.asarray(value, dtype.numpy).reshape(())


@dataclass(frozen=True)
class Value:
    """One ONNX value: a runtime IR tensor, a folded constant, or a symbolic int64 vector (see the module doc).

    ``name``: the IR value name ("" while a constant or symbolic vector has not been placed in the graph).
    ``shape``: always known in rank; dims are ints or IR symbols. ``const``: the folded array. ``sym``: the
    elements of a 1-D int64 vector as dims (ints where known, symbols otherwise; a vector with only ints is a
    constant instead). ``weight``: an initializer kept as a weight reference. ``transposed``: this value is the
    2-D transpose of that weight, not emitted yet (MatMul folds it into ``transpose_b``; anything else gets an IR
    Transpose when it consumes it).
    """

    name: str
    dtype: DType
    shape: tuple[Dim, ...]
    const: np.ndarray | None = None
    sym: tuple[Dim, ...] | None = None
    weight: bool = False
    transposed: Value | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def is_sym(self) -> bool:
        return self.sym is not None

    @property
    def known(self) -> bool:
        """Known at load time: a folded constant or a symbolic vector (its elements are known dims)."""
        return self.const is not None or self.sym is not None

    def dims(self) -> tuple[Dim, ...] | None:
        """The elements of a 1-D (or scalar) integer value as dims, where known at load time; else None."""
        if self.sym is not None:
            return self.sym
        if self.const is not None and self.const.dtype.kind in "iu" and self.const.ndim <= 1:
            return tuple(int(x) for x in self.const.reshape(-1))
        return None

    def with_name(self, name: str) -> Value:
        return replace(self, name=name)

    @staticmethod
    def of_array(array: np.ndarray, name: str = "") -> Value:
        """A folded constant (numpy bool/ints/floats; float64 stays float64 only if the caller asks for it)."""
        arr = np.asarray(array)
        return Value(name, DType.from_numpy(arr.dtype), tuple(int(d) for d in arr.shape), const=arr)

    @staticmethod
    def of_dims(dims: tuple[Dim, ...] | list[Dim], name: str = "", dtype: DType = DType.I64) -> Value:
        """A 1-D integer vector of dims (int64 unless ``dtype`` says int32): a constant when every dim is an int,
        a symbolic vector otherwise."""
        items = tuple(dims)
        if all(isinstance(d, int) for d in items):
            return Value.of_array(np.asarray(items, dtype=np.int64).astype(dtype.numpy).reshape(len(items)), name)
        return Value(name, dtype, (len(items),), sym=items)

    @staticmethod
    def scalar(value: float | int | bool, dtype: DType) -> Value:
        """A folded 0-d constant of ``dtype`` (see :func:`scalar`)."""
        return Value.of_array(scalar(value, dtype))


__all__ = ["GENERATED", "Value", "sanitize_symbol", "scalar"]
