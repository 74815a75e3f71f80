"""The one place the product imports the optional ``onnx`` package (extra ``uaii-loaders[onnx]``), and the element
type codes of ONNX as UAII dtypes for the importer (graph inputs, Cast targets)."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from uaii.ir import DType, UaiiError

from ..errors import require
from .dispatch import OnnxImportError


def onnx_module() -> ModuleType:
    """``onnx``, or a one-line MissingDependency naming the extra to install."""
    return require("onnx", "onnx", "reading ONNX models")


def elem_dtype(code: int, where: str) -> DType:
    """TensorProto.DataType ``code`` as a DType (BFLOAT16 -> bf16); types UAII lacks are an import error."""
    onnx = onnx_module()
    if code == onnx.TensorProto.BFLOAT16:
        return DType.BF16
    if code in (onnx.TensorProto.UINT16, onnx.TensorProto.UINT64):
        raise OnnxImportError(f"{where}: element type {onnx.TensorProto.DataType.Name(code)} is not supported")
    try:
        npt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        return DType.from_numpy(npt)
    except (UaiiError, KeyError, ValueError, TypeError):
        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise OnnxImportError(f"{where}: element type {name} is not supported") from None


__all__ = ["elem_dtype", "onnx_module"]
