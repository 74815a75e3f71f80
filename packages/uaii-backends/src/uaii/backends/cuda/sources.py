"""The CUDA C sources of the backend (``kernels/``) and what the host knows of them: their modules, the weight types
the decoders read (numbered as decode.cuh numbers them), and the kernel names each module defines.

Why a table here: the names are how the host finds a kernel in a compiled module (cuModuleGetFunction), so a
renamed kernel is a test failure (every listed name must appear in its source), not a launch-time surprise.
"""

from __future__ import annotations

import ctypes
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
"""The block types the int8 kernels (mmq.cu's prefill GEMM, gemv.cu's gemvq_ decode GEMV) read in their integer form
(decode.cuh: uk_unit_int)."""

PACKED_MODES = {"affine_f32": 0, "affine_f16": 1, "affine_bf16": 2, "mxfp4": 3, "nvfp4": 4, "mxfp8": 5, "nbits": 6,
                "nbits_float_zp": 7}
"""What a packed row's values are, numbered as packed.cu's PK_* modes: MLX's affine mode by its scales' type (the
type its values round to), MLX's fp modes, ONNX's MatMulNBits with packed (or default) and with float zero points."""

GEMV_ROWS = (1, 2, 4, 8)
"""Activation rows a GEMV kernel is instantiated for (gemv_<type>_m<M>, gemvq_<type>_m<M>); more rows run as several
launches."""


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
    "gemv": Module("gemv", (), (*(name for t in TYPES.values()
                                  for name in (*(f"gemv_{t[1]}_m{m}" for m in GEMV_ROWS), f"gemv_idx_{t[1]}")),
                                *(name for t in MMQ_TYPES
                                  for name in (*(f"gemvq_{TYPES[t][1]}_m{m}" for m in GEMV_ROWS),
                                               f"gemvq_idx_{TYPES[t][1]}")))),
    # bit for bit as uaii.kernels.dequantize: no contraction of d * q + m into one fma
    "dequant": Module("dequant", ("--fmad=false",),
                      tuple(f"{kind}_{t[1]}" for t in TYPES.values() for kind in ("dequant", "rows"))),
    "ops": Module("ops", (), ("rms_norm", "add_rms_norm", "layer_norm", "swiglu", "geglu", "add", "bcast", "unary",
                              "copy_rows", "rope")),
    "moe": Module("moe", (), ("moe_route", "moe_group", "moe_combine")),
    "attention": Module("attention", (), ("attn_scores", "attn_mask", "attn_softmax", "attn_wsum",
                                          "attn_wsum_sum", "attn_flash", "attn_flash_sum", "kv_store")),
    "mmq": Module("mmq", (), ("quant_act", *(f"mmq_{TYPES[t][1]}" for t in MMQ_TYPES),
                              *(f"mmq_idx_{TYPES[t][1]}" for t in MMQ_TYPES))),
    "packed": Module("packed", (), ("pk_gemv", "pk_gemv_idx", "pk_rows")),
    "ew": Module("ew", (), ("binary_f", "binary_i", "compare_f", "compare_i", "unary_i", "where_w", "cast_f",
                            "cast_f2i", "cast_i2f", "cast_i2i", "copy_nd", "gather_w", "trilu_w", "fill_w", "range_f",
                            "range_i", "reduce_f", "reduce_i", "softmax_ax", "cumsum_f", "cumsum_i", "argmax_ax",
                            "topk_ax", "matmul_f")),
}


_FAMILIES = {
    # kernel (or prefix + "_"): its parameters' C kinds — p a pointer, i int, l long long, f float
    "gemv_": "pliiplpl", "gemv_idx_": "plliiplipiipl", "gemvq_": "pliippppl", "gemvq_idx_": "plliipppipiipl",
    "dequant_": "plp",
    "rows_": "pllpiplpi", "mmq_": "pliipppipl", "mmq_idx_": "plliipppippipl", "moe_group": "piiipp",
    "quant_act": "pliippp",
    "pk_gemv": "piiiiiippplipl", "pk_gemv_idx": "piiiiiippplipiippl", "pk_rows": "piiiiipppiipipipi",
    "rms_norm": "pppifi", "add_rms_norm": "pppppifi", "swiglu": "pplilp", "geglu": "pplilpi", "add": "pppl",
    "bcast": "pplllpi", "unary": "plpifi", "copy_rows": "plplii", "layer_norm": "ppppif", "moe_route": "piiiiipp",
    "moe_combine": "ppiiip", "rope": "pppiiiiif", "attn_scores": "ppppppiiiffiipl", "attn_softmax": "pppil",
    "attn_mask": "pppipllil", "attn_wsum": "ppppiiilip", "attn_wsum_sum": "piiip", "attn_flash": "pppppppiiiiffiilip",
    "attn_flash_sum": "ppiiip", "kv_store": "pliipppi",
    "binary_f": "ppppilii", "binary_i": "ppppilipii", "compare_f": "ppppili", "compare_i": "ppppili",
    "unary_i": "plpipii", "where_w": "pppppil", "cast_f": "plpi", "cast_f2i": "plpllipi", "cast_i2f": "plpi",
    "cast_i2i": "plplli", "copy_nd": "plplpil", "gather_w": "pppllllpi", "trilu_w": "pplllli", "fill_w": "ppl",
    "range_f": "pppli", "range_i": "ppplpii", "reduce_f": "pppiillii", "reduce_i": "pppiillipii",
    "softmax_ax": "ppllli", "cumsum_f": "ppllliii", "cumsum_i": "ppllliipii", "argmax_ax": "ppllli",
    "topk_ax": "pppllliii", "matmul_f": "pppppillllffii",
}
KINDS = {"p": "a pointer", "i": "int", "l": "long long", "f": "float"}


def signature(kernel: str) -> str:
    """The C kinds of ``kernel``'s parameters (p pointer, i int, l long long, f float), as :data:`KINDS` names
    them. Checked against the sources by the tests (the host compiler's preprocessor expands the macros that
    define the kernel families), and by both devices on every launch: a c_int where the kernel reads a long long
    would read garbage on a GPU, never fail."""
    if kernel in _FAMILIES:
        return _FAMILIES[kernel]
    prefixes = [p for p in _FAMILIES if p.endswith("_") and kernel.startswith(p)]
    if not prefixes:
        raise KeyError(kernel)
    return _FAMILIES[max(prefixes, key=len)]  # gemv_idx_q4_0 is a gemv_idx_, not a gemv_


def check_args(module: str, kernel: str, args: tuple[object, ...]) -> None:
    """BackendError unless ``kernel`` is one ``module`` defines and ``args`` match its parameters: a pointer is a
    DeviceBuffer or ``ctypes.c_uint64``, the scalars ``c_int``, ``c_longlong``, ``c_float``. Runs on every launch
    that is not a graph replay: the kinds are looked up once per kernel."""
    kinds = _arg_types(module, kernel)
    if len(args) != len(kinds):
        raise _arg_error(module, kernel, args)
    for a, want in zip(args, kinds, strict=True):
        if type(a) is not want and not (want is _POINTER and hasattr(a, "ptr") and hasattr(a, "nbytes")):
            raise _arg_error(module, kernel, args)


_POINTER = ctypes.c_uint64
_TYPES = {"i": ctypes.c_int, "l": ctypes.c_longlong, "f": ctypes.c_float, "p": _POINTER}


@cache
def _arg_types(module: str, kernel: str) -> tuple[type, ...]:
    if module not in MODULES or kernel not in MODULES[module].kernels:
        from uaii.backends.base import BackendError

        raise BackendError(f"[cuda] module {module!r} has no kernel {kernel!r}")
    return tuple(_TYPES[k] for k in signature(kernel))


def _arg_error(module: str, kernel: str, args: tuple[object, ...]) -> Exception:
    """The BackendError naming the first argument that does not fit (the slow path: only on a mistake)."""
    from uaii.backends.base import BackendError

    kinds = signature(kernel)
    if len(args) != len(kinds):
        return BackendError(f"[cuda] {kernel} takes {len(kinds)} arguments, given {len(args)}")
    for i, (a, k) in enumerate(zip(args, kinds, strict=True)):
        if type(a) is not _TYPES[k] and not (k == "p" and hasattr(a, "ptr") and hasattr(a, "nbytes")):
            return BackendError(f"[cuda] {kernel}: argument {i} must be {KINDS[k]}, given {a!r}")
    return BackendError(f"[cuda] {kernel}: arguments {args!r}")


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


__all__ = ["GEMV_ROWS", "HEADERS", "KINDS", "MMQ_TYPES", "MODULES", "PACKED_MODES", "TYPES", "Module", "check_args",
           "digest", "headers", "signature", "source"]
