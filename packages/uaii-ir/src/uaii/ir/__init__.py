"""uaii.ir — the UAII intermediate representation.

Public API: element types (:class:`DType`), the immutable graph types (:class:`Tensor`, :class:`Node`,
:class:`Graph`), weight references, errors. Further modules (registry, validator, serialization, plan) export
their public names here as they land.
"""

from importlib.metadata import version as _version

from uaii.ir.dtype import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    PLAIN_TYPES,
    QUANTIZED_TYPES,
    Dim,
    DType,
    is_symbolic,
    num_elements,
    tensor_nbytes,
)
from uaii.ir.errors import FormatError, GraphError, UaiiError, UnsupportedDType, WeightRefError
from uaii.ir.graph import (
    IR_VERSION,
    Attribute,
    AttrType,
    Graph,
    Node,
    StorageHint,
    Tensor,
    attr,
    make_graph,
    needed_nodes,
    restricted,
    topological_order,
)
from uaii.ir.ops import Cost, InferCtx, InferError, Op, OpKind, OpSchema, Param, TensorType, WeightAccess, WeightInput
from uaii.ir.registry import PluginError, Registry, UnknownOpError, get_schema, register, render_markdown
from uaii.ir.serialize import dumps_json, from_bytes, load, loads_json, save, to_bytes
from uaii.ir.validator import Diagnostic, ValidationError, check, validate
from uaii.ir.weightref import WeightRef

__version__ = _version("uaii-ir")

__all__ = [
    "FLOAT_TYPES", "INTEGER_TYPES", "IR_VERSION", "PLAIN_TYPES", "QUANTIZED_TYPES",
    "AttrType", "Attribute", "DType", "Dim", "FormatError", "Graph", "GraphError", "Node", "StorageHint",
    "Tensor", "UaiiError", "UnsupportedDType", "WeightRef", "WeightRefError",
    "__version__", "attr", "is_symbolic", "make_graph", "needed_nodes", "num_elements", "restricted",
    "tensor_nbytes", "topological_order",
]
__all__ += ["dumps_json", "from_bytes", "load", "loads_json", "save", "to_bytes"]  # serialization
__all__ += [  # op registry and validator
    "Cost", "Diagnostic", "InferCtx", "InferError", "Op", "OpKind", "OpSchema", "Param", "PluginError",
    "Registry", "TensorType", "UnknownOpError", "ValidationError", "WeightAccess", "WeightInput", "check",
    "get_schema", "register", "render_markdown", "validate",
]
