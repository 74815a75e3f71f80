"""``load_model``: detect the format, read it, normalize config and weights, build and validate the graph.

Loaders are plugins: every loader, the built-in ones included, is found through the entry-point group
``uaii.loaders`` (declared in uaii-loaders' pyproject). An entry point names an object with a ``name``, a
``priority`` (higher is asked first), ``detect(path) -> bool`` and ``load(path, **options) -> LoadedModel``, and
optionally ``explain(path) -> Mismatch``: why it does not open a path its ``detect`` refused (see :mod:`.detect`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from uaii.ir import Graph, UaiiError

from . import gguf_counts, hf_counts
from .arch import build_graph
from .config import ModelConfig, from_gguf
from .detect import Mismatch, explain_gguf, explain_hf, gguf_models, unrecognized
from .errors import LoaderError
from .gguf import GGUFFile, is_gguf, open_gguf
from .hf import HFDirectory, is_hf_directory, open_hf_directory
from .hf_config import from_hf, hf_architecture
from .index import WeightIndex
from .safetensors import INDEX_NAME
from .weights import WeightSet

ENTRY_POINT_GROUP = "uaii.loaders"


@dataclass(frozen=True)
class LoadedModel:
    """A model compiled to IR: graph + where every weight's bytes are. Nothing here holds weight data."""

    path: Path  # what was opened (a file or a directory)
    base_dir: Path  # weight references are relative to this directory
    format: str  # "gguf" | "hf"
    config: ModelConfig
    graph: Graph
    weights: WeightIndex
    tokenizer_files: Mapping[str, Path] = field(default_factory=dict)
    chat_template: str | None = None
    source_metadata: Mapping[str, Any] = field(default_factory=dict)  # GGUF metadata or config.json


@runtime_checkable
class Loader(Protocol):
    name: str
    priority: int

    def detect(self, path: Path) -> bool: ...

    def load(self, path: Path, **options: Any) -> LoadedModel: ...


# --- shared finishing steps ---------------------------------------------------------------------------------
def _reconcile(cfg: ModelConfig, ws: WeightSet) -> ModelConfig:
    """Settle what the tensors decide: tied output, vocabulary size, attention biases."""
    emb = ws.need("token_embd.weight")
    tied = "output.weight" not in ws
    vocab = emb.rows
    bias = "blk.0.attn_q.bias" in ws or "blk.0.attn_qkv.bias" in ws
    types = ws.get("token_types.weight")
    return cfg.with_(tied_embeddings=tied, vocab_size=vocab or cfg.vocab_size, qkv_bias=bias,
                     type_vocab_size=types.shape[0] if types is not None else cfg.type_vocab_size)


def _finish(path: Path, base_dir: Path, fmt: str, cfg: ModelConfig, ws: WeightSet, name: str,
            validate: bool, **kw: Any) -> LoadedModel:
    cfg = _reconcile(cfg, ws)
    graph = build_graph(cfg, ws, name=name)
    if validate:
        check_graph(graph, source=str(path))
    return LoadedModel(path, base_dir, fmt, cfg, graph, ws.index, **kw)


def check_graph(graph: Graph, source: str | None = None) -> None:
    """Run the uaii-ir validator; a graph with any diagnostic is an error (builders must produce clean IR).

    ``source``: the model file or directory, named in the error (the validator only sees the graph).
    """
    from uaii.ir.validator import check  # the validator lives in uaii-ir

    check(graph, source=source)


# --- built-in loaders ---------------------------------------------------------------------------------------
def _single_gguf(path: Path) -> Path | None:
    if path.is_file():
        return path if is_gguf(path) else None
    if path.is_dir():
        models = gguf_models(path)
        return models[0] if len(models) == 1 else None
    return None


class GGUFLoader:
    name = "gguf"
    priority = 10

    def detect(self, path: Path) -> bool:
        return _single_gguf(path) is not None and not (path.is_dir() and is_hf_directory(path))

    def explain(self, path: Path) -> Mismatch:
        return explain_gguf(path)

    def load(self, path: Path, *, validate: bool = True, **_: Any) -> LoadedModel:
        file = _single_gguf(path)
        if file is None:
            raise LoaderError(f"{path}: no GGUF file found")
        g: GGUFFile = open_gguf(file)
        g.check_supported()
        gguf_counts.check_counts(g.metadata, g.tensors, g.path.name)  # before anything is sized by a count
        cfg = from_gguf(g.metadata, where=g.path.name)
        ws = WeightSet.from_gguf(WeightIndex(g.path.parent), g.tensors.values(), g.path.name)
        tpl = g.get("tokenizer.chat_template")
        name = str(g.get("general.name") or g.path.stem)
        return _finish(path, g.path.parent, "gguf", cfg, ws, name, validate,
                       tokenizer_files={"gguf": g.path}, chat_template=tpl if isinstance(tpl, str) else None,
                       source_metadata=g.metadata)


class HFLoader:
    name = "hf"
    priority = 20

    def detect(self, path: Path) -> bool:
        if path.is_dir():
            return is_hf_directory(path)
        return (path.suffix == ".safetensors" or path.name == INDEX_NAME) and is_hf_directory(path.parent)

    def explain(self, path: Path) -> Mismatch:
        return explain_hf(path)

    def load(self, path: Path, *, validate: bool = True, **_: Any) -> LoadedModel:
        directory = path if path.is_dir() else path.parent
        d: HFDirectory = open_hf_directory(directory)
        where = str(d.path / "config.json")
        arch = hf_architecture(d.config, where)
        ws = WeightSet.from_hf(WeightIndex(d.path), d.weights.tensors.values(), arch, str(d.path), d.quantization,
                               conv1d=not d.mlx)
        hf_counts.check_counts(d.config, arch, ws.weights, where)  # before anything is sized by the config
        cfg = from_hf(d.config, where=where)
        eos = d.generation_config.get("eos_token_id")
        if eos is not None:
            ids = eos if isinstance(eos, list) else [eos]
            cfg = cfg.with_(eos_token_ids=tuple(int(x) for x in ids if isinstance(x, int)))
        if d.pooling is not None and cfg.architecture == "bert":
            cfg = cfg.with_(pooling=d.pooling)
        return _finish(path, d.path, "hf", cfg, ws, d.path.name, validate, tokenizer_files=d.tokenizer_files,
                       chat_template=d.chat_template, source_metadata=d.config)


GGUF_LOADER = GGUFLoader()
HF_LOADER = HFLoader()
_NOT_BUILT = {".pt": "PyTorch", ".pth": "PyTorch", ".bin": "PyTorch", ".npz": "MLX"}


def _builtin() -> dict[str, Loader]:
    """The built-in loaders (imported here, not at module top: the ONNX loader builds on this module)."""
    from .onnx.loader import ONNX_LOADER

    return {"gguf": GGUF_LOADER, "hf": HF_LOADER, "onnx": ONNX_LOADER}


def loaders() -> list[Loader]:
    """Every registered loader, highest priority first (built-ins too come from the entry points)."""
    found: dict[str, Loader] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not break loading of every model
            raise LoaderError(f"loader plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
        found[ep.name] = obj() if isinstance(obj, type) else obj
    for name, obj in _builtin().items():  # running from a source tree without installed metadata
        found.setdefault(name, obj)
    return sorted(found.values(), key=lambda ld: (-int(getattr(ld, "priority", 0)), ld.name))


def detect_format(path: str | os.PathLike[str]) -> str:
    """The name of the loader that would open ``path``; else the error of the loader whose format the path's
    extension or content is, or every loader's reason (:mod:`.detect`)."""
    p = Path(path)
    if not p.exists():
        raise LoaderError(f"{p} does not exist")
    found = loaders()
    for ld in found:
        if ld.detect(p):
            return ld.name
    kind = _NOT_BUILT.get(p.suffix.lower())
    if kind is not None:
        raise LoaderError(f"{p}: {kind} files have no loader in this installation; supported: GGUF files, "
                          "Hugging Face directories (config.json + safetensors) and ONNX files")
    raise unrecognized(p, found)


def load_model(path: str | os.PathLike[str], *, format: str | None = None, validate: bool = True,
               **options: Any) -> LoadedModel:
    """Load a model from a GGUF file, a split GGUF, a Hugging Face directory (or its safetensors file), or an ONNX
    file (or a directory holding one)."""
    p = Path(path)
    name = format or detect_format(p)
    by_name = {ld.name: ld for ld in loaders()}
    if name not in by_name:
        raise LoaderError(f"no loader named {name!r}; available: {', '.join(sorted(by_name))}")
    try:
        return by_name[name].load(p, validate=validate, **options)
    except UaiiError:
        raise
    except RecursionError as exc:
        raise LoaderError(f"{p}: {exc}") from None


__all__ = ["ENTRY_POINT_GROUP", "GGUF_LOADER", "HF_LOADER", "GGUFLoader", "HFLoader", "LoadedModel", "Loader",
           "check_graph", "detect_format", "load_model", "loaders"]
