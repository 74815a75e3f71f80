"""Knobs of uaii-backends (environment variables), read when they are needed.

``UAII_CPU_GEMM``  ``fast`` (default): the kernels' fastest GEMM per weight type — int8 dot products over 8-bit
                   quantized activations for block-quantized weights, as llama.cpp does; ``f32``: weights dequantized
                   row by row and float32 dot products (exact against a dequantized reference, slower). A compile
                   option ``gemm=`` overrides it.
"""

from __future__ import annotations

import os

CPU_GEMM_ENV = "UAII_CPU_GEMM"


def cpu_gemm() -> str:
    return os.environ.get(CPU_GEMM_ENV, "").strip().lower() or "fast"


__all__ = ["CPU_GEMM_ENV", "cpu_gemm"]
