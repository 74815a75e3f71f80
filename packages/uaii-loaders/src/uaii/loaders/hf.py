"""Hugging Face model directories: config.json, safetensors or PyTorch checkpoint weights (single or sharded),
tokenizer files.

Tokenization is uaii-tokenizers' job; this module only records where the tokenizer files are, so that the
runtime can hand them over. PyTorch checkpoints (``pytorch_model.bin``) are read by :mod:`.torch_checkpoint`,
whose pickle reader imports and calls nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uaii.ir import FormatError

from .errors import LoaderError
from .mlx import MlxQuantization, refuse_unsupported
from .safetensors import INDEX_NAME, MAX_HEADER_BYTES, SafetensorsModel, open_safetensors
from .torch_checkpoint import INDEX_NAME as TORCH_INDEX
from .torch_checkpoint import TorchCheckpoint, open_torch

MAX_CONFIG_BYTES = 16 << 20
"""config.json, generation_config.json, modules.json: the largest published ones (longrope factor lists, label
maps) are well under 1 MiB; a document of 100 MB would cost gigabytes of Python objects to parse."""

TOKENIZER_FILES = {
    "tokenizer.json": "tokenizer_json",
    "tokenizer.model": "sentencepiece",
    "tokenizer_config.json": "tokenizer_config",
    "special_tokens_map.json": "special_tokens_map",
    "generation_config.json": "generation_config",
    "chat_template.jinja": "chat_template",
    "chat_template.json": "chat_template_json",
    "vocab.json": "vocab",
    "merges.txt": "merges",
    "vocab.txt": "vocab_txt",
    "added_tokens.json": "added_tokens",
}
"""File name → role in :attr:`HFDirectory.tokenizer_files`."""


@dataclass
class HFDirectory:
    """A model directory as found on disk."""

    path: Path
    config: dict[str, Any]
    weights: SafetensorsModel | TorchCheckpoint
    tokenizer_files: dict[str, Path] = field(default_factory=dict)
    chat_template: str | None = None
    generation_config: dict[str, Any] = field(default_factory=dict)
    pooling: str | None = None  # what a sentence-transformers Pooling module asks for; None without one
    quantization: MlxQuantization | None = None  # an mlx-lm checkpoint's (its config's "quantization")

    @property
    def mlx(self) -> bool:
        """Written by MLX (mlx-lm): safetensors metadata ``format: mlx``, or MLX's quantization in config.json. Its
        linear weights are all [out, in] (mlx-lm stores GPT-2's Conv1D weights transposed back)."""
        return self.quantization is not None or self.weights.metadata.get("format") == "mlx"


def read_json(path: Path, component: str = "hf", limit: int = MAX_HEADER_BYTES) -> Any:
    """A small JSON document of at most ``limit`` bytes; errors name the file."""
    try:
        if path.stat().st_size > limit:
            raise FormatError(f"{path.name} is larger than {limit} bytes", path=str(path),
                              offset=0, component=component)
        return json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=str(path),
                          component=component) from None
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"not valid JSON: {str(exc)[:200]}", path=str(path), component=component) from None


def is_hf_directory(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / "config.json").is_file()


def _chat_template(files: dict[str, Path]) -> str | None:
    if "chat_template" in files:
        return files["chat_template"].read_text("utf-8")
    for key in ("chat_template_json", "tokenizer_config"):
        if key in files:
            doc = read_json(files[key])
            tpl = doc.get("chat_template") if isinstance(doc, dict) else None
            if isinstance(tpl, str):
                return tpl
            if isinstance(tpl, list):  # named templates: prefer "default"
                named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
                found = named.get("default") or next(iter(named.values()), None)
                if isinstance(found, str):
                    return found
    return None


def _weights(path: Path) -> SafetensorsModel | TorchCheckpoint:
    """safetensors where the directory has them, else PyTorch checkpoints (read by our own allowlist unpickler,
    :mod:`.torch_pickle`: nothing in them is imported or run)."""
    if (path / INDEX_NAME).is_file() or any(path.glob("*.safetensors")):
        return open_safetensors(path)
    if (path / TORCH_INDEX).is_file() or (path / "pytorch_model.bin").is_file():
        return open_torch(path)
    raise LoaderError(f"{path}: no weights found (expected model.safetensors, {INDEX_NAME}, pytorch_model.bin or "
                      f"{TORCH_INDEX})")


# tensor-name suffixes that only checkpoints quantized by a scheme UAII does not read carry -> the scheme (MLX's
# .scales / .biases are read: uaii.loaders.mlx, WeightSet.from_hf)
_QUANT_SUFFIXES = {".qweight": "GPTQ/AWQ", ".qzeros": "GPTQ/AWQ",
                   ".g_idx": "GPTQ", ".weight_scale": "FP8 / compressed-tensors",
                   ".weight_scale_inv": "FP8 (block-scaled)", ".SCB": "bitsandbytes", ".absmax": "bitsandbytes"}


def _refuse_quantized(path: Path, config: dict[str, Any], weights: SafetensorsModel | TorchCheckpoint) -> None:
    """A checkpoint quantized by a scheme UAII does not read yet is named as such, instead of failing later on
    tensors "with no place in the model" (GPTQ's .qweight, FP8's .weight_scale...)."""
    hits = {name: scheme for name in weights.tensors for suffix, scheme in _QUANT_SUFFIXES.items()
            if name.endswith(suffix)}
    if not hits:
        return
    quant = config.get("quantization") or config.get("quantization_config")
    parts = [f"{k} {quant[k]}" for k in ("quant_method", "bits", "group_size", "mode") if k in quant] \
        if isinstance(quant, dict) else []
    detail = f" ({', '.join(parts)})" if parts else ""
    raise LoaderError(f"{path}: a {'/'.join(sorted(set(hits.values())))}-quantized checkpoint{detail} (e.g. tensor "
                      f"{min(hits)!r}); UAII does not read this quantization scheme yet: use the unquantized model, or "
                      "a GGUF quantization")


ST_POOLING = "sentence_transformers.models.Pooling"
_ST_MODES = (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
             ("pooling_mode_max_tokens", "max"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
             ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "lasttoken"))


def _sentence_pooling(path: Path) -> str | None:
    """The pooling of a sentence-transformers directory: its embeddings are what its Pooling module computes
    (a mean, mostly), never HF's pooler, which sentence-transformers does not apply."""
    modules_path = path / "modules.json"
    if not modules_path.is_file():
        return None
    modules = read_json(modules_path, limit=MAX_CONFIG_BYTES)
    entry = next((m for m in modules if isinstance(m, dict) and m.get("type") == ST_POOLING), None) \
        if isinstance(modules, list) else None
    if entry is None:
        return None
    cfg_path = path / str(entry.get("path") or "1_Pooling") / "config.json"
    cfg = read_json(cfg_path, limit=MAX_CONFIG_BYTES) if cfg_path.is_file() else {}
    if not isinstance(cfg, dict):
        raise FormatError("a Pooling config must hold a JSON object", path=str(cfg_path), offset=0, component="hf")
    # a key left out takes sentence-transformers' default: mean pooling and nothing else
    modes = [name for key, name in _ST_MODES if cfg.get(key, name == "mean")]
    return "+".join(modes) or "none"


def open_hf_directory(path: str | os.PathLike[str]) -> HFDirectory:
    """Read a model directory: config, weights (headers only) and the tokenizer files present. Nothing is sized
    by the config here; the loader checks its sizes against the tensors (:mod:`.hf_counts`) before it is."""
    p = Path(path).resolve()
    if not p.is_dir():
        raise LoaderError(f"{p} is not a directory")
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise LoaderError(f"{p}: no config.json; not a Hugging Face model directory")
    config = read_json(cfg_path, limit=MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise FormatError("config.json must hold a JSON object", path=str(cfg_path), offset=0, component="hf")
    weights = _weights(p)
    mlx = MlxQuantization.from_config(config, str(cfg_path))
    if mlx is not None:
        refuse_unsupported(config, weights.tensors, str(cfg_path))
    _refuse_quantized(p, config, weights)
    files = {role: p / name for name, role in TOKENIZER_FILES.items() if (p / name).is_file()}
    gen = read_json(files["generation_config"], limit=MAX_CONFIG_BYTES) if "generation_config" in files else {}
    return HFDirectory(p, config, weights, files, _chat_template(files),
                       gen if isinstance(gen, dict) else {}, _sentence_pooling(p), mlx)



__all__ = ["TOKENIZER_FILES", "HFDirectory", "is_hf_directory", "open_hf_directory", "read_json"]
