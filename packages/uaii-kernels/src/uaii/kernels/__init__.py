"""uaii.kernels — CPU kernels of UAII: GGUF (de)quantization, the IGemm interface with quantized GEMV/GEMM
kernels, and the operators of a transformer runtime. C via cffi (API mode), SIMD chosen at run time, a persistent
thread pool; see packages/uaii-kernels/README.md and docs/kernels.md.
"""

from importlib.metadata import version as _version

from uaii.kernels.gemm import (
    FAST_TYPES,
    IGemm,
    PackedWeight,
    gemm_path,
    gemm_providers,
    get_gemm,
    matmul,
    mlx_call,
    nbits_call,
    register_gemm_provider,
)
from uaii.kernels.held import from_held, held_form, write_held
from uaii.kernels.membw import copy_bandwidth
from uaii.kernels.mlxq import MlxLayout, dequantize_mlx
from uaii.kernels.native import (
    KernelError,
    available_isas,
    best_isa,
    get_isa,
    get_num_threads,
    num_threads,
    set_isa,
    set_num_threads,
    use_isa,
)
from uaii.kernels.nbits import NBitsLayout, dequantize_nbits
from uaii.kernels.ops import (
    add,
    argmax,
    attention,
    geglu,
    gelu,
    glu,
    layer_norm,
    mul,
    rms_norm,
    rope,
    rope_inv_freq,
    silu,
    softmax,
    swiglu,
    topk,
    yarn_attn_factor,
)
from uaii.kernels.quant import (
    DEQUANT_TYPES,
    QUANT_TYPES,
    dequantize,
    get_rows,
    quantize,
    quantize_activations,
    quantize_activations16,
)
from uaii.kernels.testing import random_weight

__version__ = _version("uaii-kernels")
__all__ = [
    "DEQUANT_TYPES", "FAST_TYPES", "QUANT_TYPES", "IGemm", "KernelError", "MlxLayout", "NBitsLayout", "PackedWeight",
    "__version__", "add", "argmax", "attention", "available_isas", "best_isa", "copy_bandwidth", "dequantize",
    "dequantize_mlx", "dequantize_nbits", "from_held", "geglu", "gelu", "gemm_path", "gemm_providers", "get_gemm",
    "get_isa", "get_num_threads", "get_rows", "glu", "held_form", "layer_norm", "matmul", "mlx_call", "mul",
    "nbits_call", "num_threads", "quantize", "quantize_activations", "quantize_activations16", "random_weight",
    "register_gemm_provider", "rms_norm", "rope", "rope_inv_freq", "set_isa", "set_num_threads", "silu", "softmax",
    "swiglu", "topk", "use_isa", "write_held", "yarn_attn_factor",
]
