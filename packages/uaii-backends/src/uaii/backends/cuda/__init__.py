"""uaii.backends.cuda — the CUDA backend's kernels and their compilation (extra ``uaii-backends[cuda]``).

CUDA C sources shipped in ``kernels/`` (decoders of every GGUF encoding the backend reads, fused-dequantization
GEMV for 1-8 activation rows, an int8 (``__dp4a``) GEMM for prefill on the block types, dequantize / embedding rows,
RMSNorm, SwiGLU, RoPE, decode attention over a KV cache with window and sinks), compiled at first use by NVRTC for
the device's architecture and cached on disk (:mod:`uaii.backends.cuda.nvrtc`), launched with the geometry of
:mod:`uaii.backends.cuda.geometry`. No nvcc, no system toolkit, no torch.

The executor that runs a plan's steps on a device is not in this release: the ``cuda`` backend
(:class:`uaii.backends.gpu.CudaBackend`) stays a probe that finds devices and says so, and ``device="auto"`` passes
it by. Everything here is verified without a GPU: every module compiles for sm_80 and sm_90, the decoders are built
by the host compiler too and match ``uaii.kernels.dequantize`` bit for bit, the int8 GEMM's arithmetic (integer
units, the activation quantizer, the per-pair sums) is built and checked on the host as well, and the launch
geometry is unit-tested.
"""

from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.nvrtc import ARCHS, EXTRA, Compiled, cache_dir, cache_key, compile_module, nvrtc_version
from uaii.backends.cuda.sources import GEMV_ROWS, MMQ_TYPES, MODULES, TYPES, Module, source

__all__ = ["ARCHS", "EXTRA", "GEMV_ROWS", "MMQ_TYPES", "MODULES", "TYPES", "Compiled", "Launch", "Module", "cache_dir",
           "cache_key", "compile_module", "nvrtc_version", "source"]
