"""MLX (mlx-lm) quantized checkpoints: which weights are quantized and how, read from config.json and the tensors.

mlx-lm writes a Hugging Face directory whose quantized Linear / Embedding / SwitchLinear modules hold three tensors:
``.weight`` (uint32, ``[..., out, in * bits / 32]``), ``.scales`` and (affine mode) ``.biases`` (``[..., out, in /
group_size]``). config.json's ``quantization`` (mirrored in ``quantization_config``) holds the default
``group_size``, ``bits`` and ``mode`` and per-module overrides keyed by the module's path (a dict of the same keys,
or ``false`` for a module left in float). The layout itself is uaii-ir's (:mod:`uaii.ir.ops.quantized`); the
weights stay packed (QuantizedMatMul, QuantizedEmbedding).

How a module's parameters are found is mlx-lm's own rule (``mlx_lm.utils.load_model``): its override when the map
names it, else what its tensors say — uint8 scales are one of the fp modes, told apart by the ratio of packed words
to groups (each fp mode allows one (bits, group) pair), float scales are affine with the default group size. Every
module's parameters are then checked against its tensors' shapes; a mismatch is an error naming the module, never
a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from uaii.ir import DType
from uaii.ir.ops.quantized import QUANT_MODES, check_layout, packed_words

from .errors import LoaderError
from .index import TensorInfo

SUFFIXES = (".scales", ".biases")
"""Tensor-name suffixes of a quantized module's parameters beside its ``.weight``."""
_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}
"""mlx's default (group_size, bits) per mode (mlx_lm.utils.quantize_model)."""
_FP_BY_RATIO = {(m.bits[0] * m.group_sizes[0]) // 32: name for name, m in QUANT_MODES.items() if name != "affine"}
"""Packed words per scale group → fp mode (mxfp4: 4, mxfp8: 8, nvfp4: 2): each fp mode has one (bits, group)."""


@dataclass(frozen=True)
class QuantParams:
    mode: str
    bits: int
    group_size: int

    def attrs(self) -> dict[str, Any]:
        return {"mode": self.mode, "bits": self.bits, "group_size": self.group_size}


@dataclass(frozen=True)
class MlxQuant:
    """A quantized weight's layout. Its companions are the module's other tensors: ``.scales`` and, when
    :attr:`has_biases`, ``.biases`` beside its ``.weight``."""

    params: QuantParams
    cols: int  # values per row (the module's input features)

    @property
    def has_biases(self) -> bool:
        return QUANT_MODES[self.params.mode].has_biases


def _params(entry: Any, where: str, key: str) -> QuantParams:
    if not isinstance(entry, Mapping):
        raise LoaderError(f"{where}: quantization{key} must be an object with group_size, bits and mode, found "
                          f"{entry!r}")
    mode = entry.get("mode", "affine")
    if not isinstance(mode, str) or mode not in _DEFAULTS:
        raise LoaderError(f"{where}: quantization{key} mode {mode!r} is not one of {', '.join(_DEFAULTS)}")
    gs, bits = entry.get("group_size", _DEFAULTS[mode][0]), entry.get("bits", _DEFAULTS[mode][1])
    if isinstance(gs, bool) or isinstance(bits, bool) or not isinstance(gs, int) or not isinstance(bits, int):
        raise LoaderError(f"{where}: quantization{key} group_size and bits must be integers, found {gs!r}, "
                          f"{bits!r}")
    problem = check_layout(mode, bits, gs, gs)
    if problem:
        raise LoaderError(f"{where}: quantization{key}: {problem}")
    return QuantParams(mode, bits, gs)


@dataclass(frozen=True)
class MlxQuantization:
    """config.json's ``quantization``: the default parameters and the per-module map."""

    default: QuantParams
    modules: Mapping[str, QuantParams | None]  # module path -> its parameters, None: left in float
    where: str

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> MlxQuantization | None:
        """The quantization of an mlx-lm config, or None when it has none (``quantization_config`` is read when it
        holds MLX's keys and no other tool's ``quant_method``)."""
        q = config.get("quantization")
        if q is None:
            qc = config.get("quantization_config")
            if isinstance(qc, Mapping) and "quant_method" not in qc and ("bits" in qc or "group_size" in qc):
                q = qc
        if q is None:
            return None
        if not isinstance(q, Mapping):
            raise LoaderError(f"{where}: quantization must be an object, found {type(q).__name__}")
        default = _params({k: q[k] for k in ("group_size", "bits", "mode") if k in q}, where, "")
        modules: dict[str, QuantParams | None] = {}
        for key, entry in q.items():
            if key in ("group_size", "bits", "mode"):
                continue
            if entry is False:
                modules[key] = None
            elif entry is True:
                modules[key] = default
            else:
                modules[key] = _params(entry, where, f"[{key!r}]")
        return cls(default, modules, where)

    def for_module(self, path: str, weight: TensorInfo, scales: TensorInfo, biases: TensorInfo | None) -> MlxQuant:
        """The layout of module ``path`` from its tensors (canonical companion names filled in by the caller)."""
        if len(weight.shape) < 2 or weight.shape[:-1] != scales.shape[:-1]:
            raise LoaderError(f"{self.where}: module {path!r}: weight {list(weight.shape)} and scales "
                              f"{list(scales.shape)} must agree in all but the last dimension")
        if weight.dtype is not DType.U32:
            raise LoaderError(f"{self.where}: module {path!r} has scales, so its weight must be packed uint32; "
                              f"found {weight.dtype.value}")
        if scales.dtype not in (DType.F32, DType.F16, DType.BF16, DType.U8):
            raise LoaderError(f"{self.where}: module {path!r}: scales are {scales.dtype.value}; MLX writes float32, "
                              "float16 or bfloat16 scales (affine) or uint8 codes (mxfp4, mxfp8, nvfp4)")
        words, groups = weight.shape[-1], scales.shape[-1]
        fp_scales = scales.dtype is DType.U8
        if path in self.modules:
            p = self.modules[path]
            if p is None:
                raise LoaderError(f"{self.where}: quantization[{path!r}] is false (left in float), but the "
                                  "checkpoint holds its scales")
        elif fp_scales:
            mode = _FP_BY_RATIO.get(words // groups if groups and words % groups == 0 else -1)
            if mode is None:
                raise LoaderError(f"{self.where}: module {path!r}: uint8 scales {list(scales.shape)} with packed "
                                  f"weight {list(weight.shape)} fit none of mxfp4, mxfp8, nvfp4")
            p = QuantParams(mode, *reversed(_DEFAULTS[mode]))
        else:
            gs = self.default.group_size if self.default.mode == "affine" else _DEFAULTS["affine"][0]
            bits = words * 32 // (groups * gs) if groups else 0
            p = QuantParams("affine", bits, gs)
        cols = groups * p.group_size
        problem = check_layout(p.mode, p.bits, p.group_size, cols)
        if problem is None and packed_words(cols, p.bits) != words:
            problem = (f"{groups} groups of {p.group_size} values at {p.bits} bits need {packed_words(cols, p.bits)} "
                       f"words per row")
        if problem is None and (QUANT_MODES[p.mode].scale == "float") == fp_scales:
            problem = f"{p.mode} scales are {'float' if QUANT_MODES[p.mode].scale == 'float' else 'uint8'}"
        if problem is None and QUANT_MODES[p.mode].has_biases != (biases is not None):
            problem = f"{p.mode} {'needs' if biases is None else 'has no'} biases"
        if problem is None and biases is not None and (biases.shape, biases.dtype) != (scales.shape, scales.dtype):
            problem = f"biases {biases.dtype.value} {list(biases.shape)} differ from scales"
        if problem:
            raise LoaderError(f"{self.where}: module {path!r} ({p.mode}, {p.bits} bits, groups of {p.group_size}) "
                              f"does not fit its tensors (weight {weight.dtype.value} {list(weight.shape)}, scales "
                              f"{scales.dtype.value} {list(scales.shape)}): {problem}")
        return MlxQuant(p, cols)


def refuse_unsupported(config: Mapping[str, Any], tensor_names: Iterable[str], where: str) -> None:
    """What mlx-lm can write that UAII does not run yet, said by name: activation quantization (QQLinear) and the
    per-tensor ``global_scale`` of nvfp4 expert banks."""
    if config.get("quantize_activations"):
        raise LoaderError(f"{where}: quantize_activations is set (mlx's QQLinear quantizes activations too); UAII "
                          "runs MLX-quantized weights with float activations only")
    scaled = sorted(n for n in tensor_names if n.endswith(".global_scale"))
    if scaled:
        raise LoaderError(f"{where}: tensor {scaled[0]!r} is an nvfp4 global scale (mlx-lm's --global-scale); UAII "
                          "does not read MLX global scales yet")


def module_path(tensor_name: str) -> str:
    """An MLX module's path from one of its tensors' names (``...q_proj.weight`` → ``...q_proj``)."""
    return tensor_name.rsplit(".", 1)[0]


__all__ = ["SUFFIXES", "MlxQuant", "MlxQuantization", "QuantParams", "module_path", "refuse_unsupported"]
