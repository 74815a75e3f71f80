"""NodeContext: everything a handler sees of the ONNX node it translates, and the only way it builds IR.

A handler reads attributes (converted to Python values, defaults supplied by the handler), its inputs as
:class:`~.values.Value` objects, asks for load-time numbers (``const``, ``dims``), and emits IR through
:meth:`NodeContext.emit` — which folds nodes whose inputs are all constants with uaii.ir's reference. Errors it
raises name the model file and the node, so a user can find the node in Netron.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from uaii.ir import Dim, DType

from .builder import GraphBuilder
from .dispatch import OnnxImportError
from .values import Value

ConstReader = Callable[[str, int], "np.ndarray | None"]
"""(initializer name, byte limit) -> its values, or None when it is larger than the limit."""


class NodeContext:
    """The ``ctx`` of a handler; see /work/briefs/14/api-importer.md for the contract."""

    def __init__(self, node: Any, index: int, opset: int, version: int, inputs: Sequence[Value | None],
                 builder: GraphBuilder, read_initializer: ConstReader, used: Callable[[str], bool],
                 notes: list[str], file_name: str) -> None:
        self.node = node
        self.index = index
        self.domain: str = node.domain if node.domain != "ai.onnx" else ""
        self.op_type: str = node.op_type
        self.name: str = node.name or f"{node.op_type}#{index}"
        self.opset = opset
        self.version = version
        self.inputs: list[Value | None] = list(inputs)
        self.output_names: tuple[str, ...] = tuple(node.output)
        self._b = builder
        self._read = read_initializer
        self._used = used
        self._notes = notes
        self.where = f"{file_name}: node {self.name!r} ({self.domain or 'ai.onnx'}::{self.op_type} v{version})"
        self.attrs: dict[str, Any] = {a.name: _attr_value(a, self.where) for a in node.attribute}

    # --- attributes -----------------------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def need_attr(self, name: str) -> Any:
        if name not in self.attrs:
            self.fail(f"the required attribute {name!r} is missing")
        return self.attrs[name]

    # --- inputs ---------------------------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def optional(self, i: int) -> Value | None:
        return self.inputs[i] if 0 <= i < len(self.inputs) else None

    def input(self, i: int) -> Value:
        v = self.optional(i)
        if v is None:
            self.fail(f"input #{i} is required but missing")
        return v

    def const(self, i: int, limit: int = 1 << 20) -> np.ndarray | None:
        """Input ``i``'s numbers when known at load time (a folded constant, an all-int symbolic vector, or an
        initializer of at most ``limit`` bytes read from the file); else None."""
        v = self.optional(i)
        if v is None:
            return None
        if v.const is not None:
            return v.const
        if v.sym is not None and all(isinstance(d, int) for d in v.sym):
            return np.asarray(v.sym, np.int64).astype(v.dtype.numpy).reshape(tuple(int(d) for d in v.shape))
        if v.weight and v.transposed is None:
            return self._read(v.name, limit)
        return None

    def need_const(self, i: int, what: str) -> np.ndarray:
        arr = self.const(i)
        if arr is None:
            self.fail(f"input #{i} ({what}) must be known at load time (a constant or a shape computation that "
                      "folds); it is computed at run time")
        return arr

    def dims(self, i: int) -> tuple[Dim, ...] | None:
        """A 1-D (or scalar) integer input's elements as dims (ints and symbols), when known at load time."""
        v = self.optional(i)
        if v is None:
            return None
        if v.dims() is not None:
            return v.dims()
        arr = self.const(i)
        if arr is not None and arr.dtype.kind in "iu" and arr.ndim <= 1:
            return tuple(int(x) for x in arr.reshape(-1))
        return None

    # --- outputs --------------------------------------------------------------------------------------------
    @property
    def n_outputs(self) -> int:
        return len(self.output_names)

    def output_used(self, i: int) -> bool:
        return i < len(self.output_names) and bool(self.output_names[i]) and self._used(self.output_names[i])

    # --- building -------------------------------------------------------------------------------------------
    def emit(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any] | None = None, *,
             version: int = 1, dtype: DType | None = None, shape: Sequence[Dim] | None = None) -> Value:
        return self._b.emit(op, inputs, attrs, 1, version, [dtype], [shape], self.where)[0]

    def emit_n(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any] | None = None, *,
               outputs: int, version: int = 1, dtypes: Sequence[DType | None] | None = None,
               shapes: Sequence[Sequence[Dim] | None] | None = None) -> list[Value]:
        return self._b.emit(op, inputs, attrs, outputs, version, dtypes, shapes, self.where)

    def constant(self, array: np.ndarray | Any) -> Value:
        return Value.of_array(np.asarray(array))

    def symbolic(self, dims: Sequence[Dim]) -> Value:
        return Value.of_dims(list(dims))

    def fresh(self, hint: str = "d") -> str:
        return self._b.fresh_symbol(hint)

    def fail(self, message: str) -> NoReturn:
        raise OnnxImportError(f"{self.where}: {message}")

    def warn(self, message: str) -> None:
        self._notes.append(f"{self.where}: {message}")

    # --- for the symbolic folding helpers (fold.py) ---------------------------------------------------------
    @property
    def builder(self) -> GraphBuilder:
        return self._b


def _attr_value(a: Any, where: str) -> Any:
    """An onnx AttributeProto as a Python value (strings decoded, lists as tuples, tensors as numpy arrays)."""
    from .onnx_api import onnx_module

    onnx = onnx_module()
    t = a.type
    AP = onnx.AttributeProto
    if t == AP.INT:
        return int(a.i)
    if t == AP.FLOAT:
        return float(a.f)
    if t == AP.STRING:
        return a.s.decode("utf-8", "replace")
    if t == AP.INTS:
        return tuple(int(x) for x in a.ints)
    if t == AP.FLOATS:
        return tuple(float(x) for x in a.floats)
    if t == AP.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in a.strings)
    if t == AP.TENSOR:
        return tensor_value(a.t, f"{where}, attribute {a.name!r}")
    if t == AP.GRAPH:
        return a.g
    if t == AP.GRAPHS:
        return tuple(a.graphs)
    raise OnnxImportError(f"{where}: attribute {a.name!r} has type {t}, which the importer does not read")


def tensor_value(t: Any, where: str) -> np.ndarray:
    """A TensorProto held inside the graph (a Constant's value) as a numpy array; external data is refused."""
    from .onnx_api import onnx_module

    onnx = onnx_module()
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise OnnxImportError(f"{where}: a tensor attribute with external data is not supported")
    try:
        arr = onnx.numpy_helper.to_array(t)
    except Exception as exc:  # onnx raises ValueError/TypeError/... on malformed tensors
        from uaii.ir import FormatError

        raise FormatError(f"[onnx] {where}: the tensor value cannot be decoded: {exc}") from None
    return _plain(arr, where)


def _plain(arr: np.ndarray, where: str) -> np.ndarray:
    """Numpy types of the IR: bf16 as raw uint16 words; ml_dtypes' float8/int4 are not supported."""
    if arr.dtype.kind in "fiub" and arr.dtype.itemsize <= 8 and arr.dtype.name in _PLAIN:
        return arr
    if arr.dtype.name == "bfloat16":
        return arr.view(np.uint16)
    raise OnnxImportError(f"{where}: constant of element type {arr.dtype} is not supported")


_PLAIN = {"float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint32", "bool"}
"""uint16 is not here: in the IR a uint16 array means bf16 words."""

__all__ = ["NodeContext", "tensor_value"]
