"""The weights a builder sees: canonical name → reference, location and layout.

A :class:`WeightSet` is built from a format's tensors and fills the model's :class:`WeightIndex` as it goes.
References always carry the tensor's name *in its file*
(``model.safetensors#model.layers.0.mlp.up_proj.weight``); the canonical name (``blk.0.ffn_up.weight``, see
:mod:`uaii.loaders.names`) is only how builders look them up. Packed expert banks (``*_exps``) are indexed
whole and per expert (``#e=N``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from uaii.ir import WeightRef

from .errors import LoaderError
from .index import TensorInfo, WeightIndex
from .mlx import SUFFIXES, MlxQuant, MlxQuantization, module_path
from .names import BANK_PART, hf_to_canonical, unmapped


@dataclass(frozen=True)
class Weight:
    """One weight as a builder uses it. ``transposed``: stored ``[in, out]`` (GPT-2 Conv1D), not ``[out, "
      "in]``."""

    name: str
    ref: WeightRef
    info: TensorInfo
    transposed: bool = False
    quant: MlxQuant | None = None  # an MLX-quantized weight: info is its packed uint32 tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def logical_shape(self) -> tuple[int, ...]:
        """The matrix the weight stands for: the stored shape, or an MLX-quantized weight's unpacked one."""
        return self.info.shape if self.quant is None else (*self.info.shape[:-1], self.quant.cols)

    @property
    def rows(self) -> int:
        """Output features: ``shape[0]`` of ``[out, in]``, ``shape[-1]`` of a transposed ``[in, out]``."""
        return self.info.shape[-1] if self.transposed else self.info.shape[0]


class WeightSet:
    """Canonical weights of one model, with the index the storage layer reads through."""

    def __init__(self, index: WeightIndex, where: str) -> None:
        self.index, self.where = index, where
        self.weights: dict[str, Weight] = {}
        self.banks: dict[str, list[Weight]] = {}

    def _add(self, canonical: str, info: TensorInfo, transposed: bool = False) -> None:
        if canonical in self.weights:
            raise LoaderError(f"{self.where}: tensors {self.weights[canonical].info.name!r} and "
                              f"{info.name!r} both "
                              f"map to {canonical!r}")
        ref = self.index.add(info)
        self.weights[canonical] = Weight(canonical, ref, info, transposed)
        if BANK_PART.match(canonical):
            if len(info.shape) != 3:
                raise LoaderError(f"{self.where}: expert bank {info.name!r} has shape {list(info.shape)}; "
                                  "expected "
                                  "[experts, rows, cols]")
            refs = self.index.add_bank(info)
            self.banks[canonical] = [Weight(f"{canonical}#e={e}", r, info.expert(e), transposed)
                                     for e, r in enumerate(refs)]

    @classmethod
    def from_gguf(cls, index: WeightIndex, tensors: Iterable[TensorInfo], where: str) -> WeightSet:
        ws = cls(index, where)
        for info in tensors:
            ws._add(info.name, info)
        return ws

    @classmethod
    def from_hf(cls, index: WeightIndex, tensors: Iterable[TensorInfo], arch: str, where: str,
                quantization: MlxQuantization | None = None, conv1d: bool = True) -> WeightSet:
        """``quantization``: an mlx-lm checkpoint's (config.json); its modules' ``.scales`` / ``.biases`` are then
        attached to their ``.weight`` (:attr:`Weight.quant`). ``conv1d``: GPT-2's linear weights are stored as HF's
        Conv1D ([in, out]); MLX checkpoints store them [out, in]."""
        ws = cls(index, where)
        mapped = [(info, hf_to_canonical(info.name, arch)) for info in tensors]
        stray = unmapped((info.name for info, m in mapped if m is None), arch)
        if stray:
            raise LoaderError(f"{where}: {len(stray)} tensors have no place in a {arch} model, e.g. "
                              f"{', '.join(stray[:3])}")
        for info, m in mapped:
            if m is not None:
                ws._add(m[0], info, m[1] and conv1d)
        ws._attach_quantization(quantization)
        return ws

    def _attach_quantization(self, quantization: MlxQuantization | None) -> None:
        """Pair every MLX ``.scales`` (and ``.biases``) with its module's ``.weight``: one check of the pairs, then
        the module's layout from config.json and the three tensors (:meth:`MlxQuantization.for_module`)."""
        stems = sorted({name.rsplit(".", 1)[0] for name in self.weights if name.endswith(SUFFIXES)})
        for stem in stems:
            w, scales, biases = (self.weights.get(f"{stem}.{part}") for part in ("weight", "scales", "biases"))
            found = min(x.info.name for x in (scales, biases) if x is not None)
            if quantization is None:
                raise LoaderError(f"{self.where}: tensor {found!r} is an MLX quantization parameter, but config.json "
                                  "has no \"quantization\" (mlx-lm writes group_size, bits and mode there) to say how "
                                  "the weights are packed")
            if w is None or scales is None:
                raise LoaderError(f"{self.where}: tensor {found!r} has no {'weight' if w is None else 'scales'} "
                                  f"beside it ({module_path(found)}.{'weight' if w is None else 'scales'})")
            q = quantization.for_module(module_path(w.info.name), w.info, scales.info,
                                        None if biases is None else biases.info)
            self.weights[w.name] = replace(w, quant=q)

    # --- lookups --------------------------------------------------------------------------------------------
    def get(self, name: str) -> Weight | None:
        return self.weights.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.weights

    def need(self, name: str) -> Weight:
        w = self.weights.get(name)
        if w is None:
            raise LoaderError(f"{self.where}: missing tensor {name!r}")
        return w

    def bank(self, layer: int, proj: str, n_experts: int) -> Weight | None:
        """The expert bank of ``proj`` in ``layer`` as one weight ``[n_experts, rows, cols]``.

        GGUF stores a real bank. Hugging Face stores one tensor per expert; they become a *virtual* bank whose
        reference (``file#...experts.*.w1.weight``) resolves only per expert (``#e=N``) in the index.
        """
        canonical = f"blk.{layer}.ffn_{proj}_exps.weight"
        w = self.weights.get(canonical)
        if w is not None:
            if w.shape[0] != n_experts:
                raise LoaderError(f"{self.where}: bank {w.info.name!r} holds {w.shape[0]} experts; the "
                                  "config says "
                                  f"{n_experts}")
            return w
        parts = self.experts(layer, proj, n_experts)
        if not parts:
            return None
        first = parts[0]
        for p in parts[1:]:
            if (p.info.dtype, p.shape, p.transposed) != (first.info.dtype, first.shape, first.transposed):
                raise LoaderError(f"{self.where}: expert tensors {first.info.name!r} and {p.info.name!r} "
                                  "differ in "
                                  "dtype or shape")
        vname = re.sub(r"experts\.0\.", "experts.*.", first.info.name, count=1)
        if vname == first.info.name:
            vname = f"{first.info.name}[*]"
        ref = WeightRef(first.ref.path, vname)
        self.index.add_virtual_bank(ref, [p.info for p in parts])
        info = TensorInfo(vname, first.info.dtype, (n_experts, *first.shape), first.info.file, -1,
                          sum(p.info.nbytes for p in parts))
        bank = Weight(canonical, ref, info, first.transposed)
        self.weights[canonical] = bank
        return bank

    def experts(self, layer: int, proj: str, n_experts: int) -> list[Weight]:
        """The ``n_experts`` weights of projection ``proj`` (gate, up, down, gate_up) in ``layer``."""
        bank = self.banks.get(f"blk.{layer}.ffn_{proj}_exps.weight")
        if bank is None:
            found = (self.weights.get(f"blk.{layer}.ffn_{proj}.{e}.weight") for e in range(n_experts))
            bank = [w for w in found if w is not None]

            if not bank:
                return []
        if len(bank) != n_experts:
            raise LoaderError(f"{self.where}: layer {layer} has {len(bank)} '{proj}' experts; the config "
                              "says "
                              f"{n_experts}")
        return bank


__all__ = ["Weight", "WeightSet"]
