"""The CUDA C sources of the backend (``kernels/``) and what the host knows of them: their modules, the weight types
the decoders read (numbered as decode.cuh numbers them), and the kernel names each module defines.

Why a table here: the names are how the host finds a kernel in a compiled module (cuModuleGetFunction), so a
renamed kernel is a test failure (every listed name must appear in its source), not a launch-time surprise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from uaii.ir import DType

HEADERS = ("decode.cuh",)
"""Headers the modules include (a module's cache key covers them)."""

TYPES: dict[DType, tuple[int, str, int, int]] = {
    # dtype: (decode.cuh's number, kernel suffix, bytes per block, 32-value units per block)
    DType.F32: (0, "f32", 128, 1),
    DType.F16: (1, "f16", 64, 1),
    DType.BF16: (2, "bf16", 64, 1),
    DType.Q4_0: (3, "q4_0", 18, 1),
    DType.Q4_1: (4, "q4_1", 20, 1),
    DType.Q5_0: (5, "q5_0", 22, 1),
    DType.Q5_1: (6, "q5_1", 24, 1),
    DType.Q8_0: (7, "q8_0", 34, 1),
    DType.Q4_K: (8, "q4_k", 144, 8),
    DType.Q5_K: (9, "q5_k", 176, 8),
    DType.Q6_K: (10, "q6_k", 210, 8),
}
"""The weight encodings the CUDA kernels decode in registers (GEMV, dequantize, embedding rows)."""

MMQ_TYPES = (DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q4_K, DType.Q5_K, DType.Q6_K)
"""The block types the int8 prefill GEMM (mmq.cu) reads in their integer form (decode.cuh: uk_unit_int)."""

GEMV_ROWS = (1, 2, 4, 8)
"""Activation rows a GEMV kernel is instantiated for (gemv_<type>_m<M>); more rows run as several launches."""


@dataclass(frozen=True)
class Module:
    """One .cu source: its file, the NVRTC options it needs beyond the defaults, and its kernels."""

    name: str
    options: tuple[str, ...]
    kernels: tuple[str, ...]

    @property
    def filename(self) -> str:
        return f"{self.name}.cu"


MODULES: dict[str, Module] = {
    "gemv": Module("gemv", (), tuple(f"gemv_{t[1]}_m{m}" for t in TYPES.values() for m in GEMV_ROWS)),
    # bit for bit as uaii.kernels.dequantize: no contraction of d * q + m into one fma
    "dequant": Module("dequant", ("--fmad=false",),
                      tuple(f"{kind}_{t[1]}" for t in TYPES.values() for kind in ("dequant", "rows"))),
    "ops": Module("ops", (), ("rms_norm", "add_rms_norm", "swiglu", "add", "rope")),
    "attention": Module("attention", (), ("attn_scores", "attn_softmax", "attn_wsum")),
    "mmq": Module("mmq", (), ("quant_act", *(f"mmq_{TYPES[t][1]}" for t in MMQ_TYPES))),
}


@cache
def source(filename: str) -> str:
    """The text of a kernel source or header shipped in this package."""
    return (resources.files("uaii.backends.cuda") / "kernels" / filename).read_text(encoding="utf-8")


def headers() -> dict[str, str]:
    return {h: source(h) for h in HEADERS}


def digest(module: Module) -> str:
    """sha256 of a module's source, the headers it may include and its options (the compiled code's identity)."""
    h = hashlib.sha256()
    for part in (module.filename, source(module.filename), *(f"{n}\0{t}" for n, t in headers().items()),
                 *module.options):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


__all__ = ["GEMV_ROWS", "HEADERS", "MMQ_TYPES", "MODULES", "TYPES", "Module", "digest", "headers", "source"]
