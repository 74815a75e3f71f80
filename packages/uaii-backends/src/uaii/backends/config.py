"""Knobs of uaii-backends (environment variables), read when they are needed.

``UAII_CPU_GEMM``  ``fast`` (default): the kernels' fastest GEMM per weight type — int8 dot products over 8-bit
                   quantized activations for block-quantized weights, as llama.cpp does, and 16-bit activations for
                   the output projection where the type has that kernel (Q8_0; ``uk_gemm`` mode 2); ``f32``:
                   weights dequantized row by row and float32 dot products (the exact result of the dequantized
                   weights, slower). The default of the CPU backend's compile option ``gemm=`` (the Session option
                   ``gemm``, the CLI's ``--gemm``). Either mode gives prefill and decode the same bits for the same
                   position.
``UAII_ALLOW_SOFTWARE_GPU``  ``1``: a GPU backend named by ``device=`` may run on a software adapter (lavapipe,
                   SwiftShader: correct and slow); ``device="auto"`` never picks one. The process's opt-in
                   (:func:`uaii.backends.registry.allow_software_devices`, the CLI's ``--allow-software-adapter``).
"""

from __future__ import annotations

import os

CPU_GEMM_ENV = "UAII_CPU_GEMM"
ALLOW_SOFTWARE_ENV = "UAII_ALLOW_SOFTWARE_GPU"
GEMM_MODES = ("fast", "f32")


def cpu_gemm() -> str:
    """The GEMM mode ``$UAII_CPU_GEMM`` asks for (``fast`` when unset); an unknown value is an error."""
    from uaii.backends.base import BackendError

    mode = os.environ.get(CPU_GEMM_ENV, "").strip().lower() or "fast"
    if mode not in GEMM_MODES:
        raise BackendError(f"[backend] {CPU_GEMM_ENV} must be one of {', '.join(GEMM_MODES)}, found {mode!r}")
    return mode


__all__ = ["ALLOW_SOFTWARE_ENV", "CPU_GEMM_ENV", "GEMM_MODES", "cpu_gemm"]
