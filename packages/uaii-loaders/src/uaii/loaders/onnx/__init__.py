"""uaii.loaders.onnx — ONNX models as UAII IR (extra ``uaii-loaders[onnx]``).

Internal package of uaii-loaders: the file layer (``reader.open_onnx``: the protobuf read without weights, external
data sandboxed), the importer (``importer.import_graph``: dispatch on (domain, op type, since-version), symbolic
shape folding, one handler per op version) and the loader (``loader.ONNX_LOADER``, entry point ``onnx``). The
public names are re-exported by :mod:`uaii.loaders`. Nothing here imports ``onnx`` at import time.
"""

from .dispatch import AI_ONNX, MIN_OPSET, MS_DOMAIN, OnnxImportError, onnx_op, supported_ops
from .reader import OnnxFile, open_onnx
from .values import Value, sanitize_symbol

__all__ = ["AI_ONNX", "MIN_OPSET", "MS_DOMAIN", "OnnxFile", "OnnxImportError", "Value", "onnx_op", "open_onnx",
           "sanitize_symbol", "supported_ops"]
