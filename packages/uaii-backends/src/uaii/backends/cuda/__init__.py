"""uaii.backends.cuda — the CUDA backend (extra ``uaii-backends[cuda]``): CUDA C kernels compiled at first use by
NVRTC, launched through the driver API (cuda-bindings), an executor that runs a plan's steps on the device.

- ``kernels/``: decoders of every GGUF encoding the backend reads, fused-dequantization GEMV for 1-8 activation
  rows (on int8 activations with ``__dp4a`` for the block types, ``gemm="fast"``; on floats for the others and with
  ``gemm="f32"``), an int8 GEMM for prefill on the block types, dequantize / embedding rows, RMSNorm, SwiGLU,
  GeGLU, RoPE, KV-cache writes and attention over per-row KV tables with window and sinks; compiled for the
  device's architecture and cached on disk (:mod:`uaii.backends.cuda.nvrtc`), launched with the geometry of
  :mod:`uaii.backends.cuda.geometry`. No nvcc, no system toolkit, no torch.
- :class:`CudaBackend` / :class:`~uaii.backends.cuda.executable.CudaExecutable`: weights resident on the device or
  streamed through two staging slots on a copy stream that overlaps the kernels (a model larger than the device
  budget runs), KV states in device memory (:class:`~uaii.backends.cuda.kv_state.CudaKVState`), batched decode rows.
- :class:`~uaii.backends.cuda.host.HostDevice`: a host model of a device that runs every launch through its
  kernel's CPU reference (:mod:`uaii.backends.cuda.reference`), checks every pointer and argument, and runs streams
  in an adversarial order — how the executor is tested without a GPU.

``device="auto"`` does not pick this backend until it has run on a GPU (``--device cuda`` runs it); see
docs/backends.md.
"""

from uaii.backends.cuda.backend import NOT_AUTO, CudaBackend
from uaii.backends.cuda.geometry import Launch
from uaii.backends.cuda.nvrtc import ARCHS, EXTRA, Compiled, cache_dir, cache_key, compile_module, nvrtc_version
from uaii.backends.cuda.sources import GEMV_ROWS, MMQ_TYPES, MODULES, TYPES, Module, signature, source

__all__ = ["ARCHS", "EXTRA", "GEMV_ROWS", "MMQ_TYPES", "MODULES", "NOT_AUTO", "TYPES", "Compiled", "CudaBackend",
           "Launch", "Module", "cache_dir", "cache_key", "compile_module", "nvrtc_version", "signature", "source"]
