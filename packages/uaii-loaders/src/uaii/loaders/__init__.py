"""uaii.loaders — read model formats and compile them to UAII IR graphs.

    from uaii.loaders import load_model
    model = load_model("SmolLM2-135M-Instruct.Q4_1.gguf")   # or a Hugging Face directory
    model.graph        # validated uaii.ir.Graph; weights are WeightRefs, never data
    model.weights      # WeightIndex: str(ref) -> TensorInfo(file, offset, nbytes, dtype, shape)
    model.config       # ModelConfig, one convention for every format

Formats: GGUF (v2/v3, split files), safetensors (single, sharded) inside Hugging Face directories, ONNX files
(extra ``uaii-loaders[onnx]``: the graph is translated op by op, see :mod:`uaii.loaders.onnx`).
Architectures: see :func:`supported_architectures`. Loaders are plugins of the entry-point group
``uaii.loaders``.
"""

from importlib.metadata import version as _version

from uaii.loaders.arch import build_graph, supported_architectures
from uaii.loaders.config import ModelConfig, RopeConfig, from_gguf
from uaii.loaders.errors import LoaderError, MissingDependency
from uaii.loaders.gguf import SUPPORTED_DTYPES, GGUFFile, open_gguf
from uaii.loaders.hf import HFDirectory, open_hf_directory
from uaii.loaders.hf_config import from_hf
from uaii.loaders.index import TensorInfo, WeightIndex
from uaii.loaders.model import LoadedModel, Loader, detect_format, load_model, loaders
from uaii.loaders.onnx import OnnxFile, OnnxImportError, open_onnx, supported_ops
from uaii.loaders.safetensors import SafetensorsModel, open_safetensors
from uaii.loaders.weights import Weight, WeightSet

__version__ = _version("uaii-loaders")
__all__ = [
    "SUPPORTED_DTYPES", "GGUFFile", "HFDirectory", "LoadedModel", "Loader", "LoaderError",
    "MissingDependency", "ModelConfig", "OnnxFile", "OnnxImportError", "RopeConfig", "SafetensorsModel",
    "TensorInfo", "Weight", "WeightIndex", "WeightSet",
    "__version__", "build_graph", "detect_format", "from_gguf", "from_hf", "load_model", "loaders",
    "open_gguf", "open_hf_directory", "open_onnx", "open_safetensors", "supported_architectures", "supported_ops",
]
