"""Loading: a path becomes an IR graph, a weight location index, a tokenizer and what the Session needs to know.

``.uaii`` / ``.uaii.json`` / ``.json`` files are IR graphs (uaii.ir.serialize): their weight references resolve
against the file's directory — raw-file references with :func:`uaii.storage.locate_raw_file`, container references
(``file.gguf#tensor``, ``file.safetensors#tensor``) through the loaders' readers. Anything else goes through
:func:`uaii.loaders.load_model` (GGUF, Hugging Face directories, ONNX).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uaii.ir import Graph, UaiiError, WeightRef
from uaii.runtime.errors import SessionError
from uaii.runtime.results import ModelInfo

log = logging.getLogger("uaii.runtime")
IR_SUFFIXES = (".uaii", ".json")


@dataclass
class ModelBundle:
    """Everything loaded from a path, before planning."""

    path: Path
    format: str  # "gguf" | "hf" | "uaii"
    graph: Graph
    locations: Mapping[str, Any]  # weight reference -> location (uaii.storage.LocationIndex)
    tokenizer: Any = None
    config: Any = None
    context_length: int = 0
    stop_ids: frozenset[int] = frozenset()
    info: ModelInfo | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def generative(self) -> bool:
        """A decoder LM: token/position inputs, a cached attention per layer and a logits output."""
        g = self.graph
        return ("tokens" in g.inputs and "positions" in g.inputs and bool(g.outputs)
                and g.outputs[0] == "logits" and any(n.startswith("past_k.") for n in g.inputs))


def is_ir_file(path: Path) -> bool:
    """``*.uaii``, ``*.uaii.json``, or a ``*.json`` whose top level is an IR graph (not an HF config.json)."""
    if not path.is_file():
        return False
    name = path.name.lower()
    if name.endswith((".uaii", ".uaii.json")):
        return True
    if not name.endswith(".json"):
        return False
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return b'"ir_version"' in head or b'"nodes"' in head


def load_bundle(path: str | Path | ModelBundle) -> ModelBundle:
    """A bundle passes through as it is: a caller that resolved an IR file's weights elsewhere (the C API's
    ``weights_dir`` / filled weights, see :func:`ir_bundle`) hands the Session what it would otherwise load."""
    if isinstance(path, ModelBundle):
        return path
    p = Path(path)
    if not p.exists():
        raise SessionError(f"[runtime] {p}: no such file or directory")
    if is_ir_file(p):
        return _load_ir(p)
    return _load_model(p)


def _load_model(p: Path) -> ModelBundle:
    from uaii.loaders import load_model

    model = load_model(p)
    cfg = model.config
    tok = _tokenizer(model.tokenizer_files, model.base_dir, model.source_metadata if model.format == "gguf" else None)
    stops = set(cfg.eos_token_ids or ())
    if tok is not None:
        stops |= set(getattr(tok, "stop_ids", ()) or ())
        if tok.eos_id is not None:
            stops.add(int(tok.eos_id))
    info = _info(p, model.format, cfg.architecture, _config_dict(cfg), model.graph, model.weights)
    return ModelBundle(p, model.format, model.graph, model.weights, tok, cfg, int(cfg.context_length or 0),
                       frozenset(stops), info, dict(model.source_metadata or {}))


def _tokenizer(files: Mapping[str, Path], base: Path, gguf_metadata: Mapping[str, Any] | None = None) -> Any:
    from uaii.tokenizers import from_gguf_metadata, load

    candidates = [files["gguf"]] if "gguf" in files else [base]
    for c in candidates:
        try:
            if gguf_metadata is not None and "gguf" in files:  # the vocabulary the loader read, not a second copy
                return from_gguf_metadata(gguf_metadata, c)
            return load(c)
        except Exception as exc:  # a model without a usable tokenizer still runs on token ids
            log.warning("[runtime] no tokenizer for %s: %s", c, exc)
    return None


def _config_dict(cfg: Any) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    if is_dataclass(cfg) and not isinstance(cfg, type):
        return {k: v for k, v in asdict(cfg).items() if not isinstance(v, bytes)}
    return dict(getattr(cfg, "__dict__", {}))


def _info(p: Path, fmt: str, arch: str, config: dict[str, Any], graph: Graph,
          locations: Mapping[str, Any]) -> ModelInfo:
    tensors, n_params, nbytes = [], 0, 0
    for t in graph.weights:
        shape = [int(d) for d in t.shape]
        n = int(np.prod(shape)) if shape else 1
        n_params += n
        size = _nbytes(locations, t)
        nbytes += size
        tensors.append({"name": t.name, "dtype": t.dtype.value, "shape": shape, "bytes": size})
    return ModelInfo(arch, str(p), fmt, config, n_params, tensors, len(graph.nodes), nbytes)


def _nbytes(locations: Mapping[str, Any], t: Any) -> int:
    """Bytes of a weight as the index records them (a bank of separate expert tensors: their sum)."""
    if t.weight is None:
        return len(t.data or b"")
    try:
        return int(locations[str(t.weight)].nbytes)
    except (KeyError, UaiiError):
        n = int(t.shape[0]) if t.shape else 0
        try:
            return sum(int(locations[str(t.weight.with_expert(e))].nbytes) for e in range(n))
        except (KeyError, UaiiError):
            return 0


# --- IR files -------------------------------------------------------------------------------------------------
def _load_ir(p: Path) -> ModelBundle:
    from uaii.ir.serialize import load
    from uaii.ir.validator import check

    graph = load(p)
    check(graph, source=str(p))  # here, where the file is known: the planner would say the same without naming it
    return ir_bundle(p, graph, ir_locations(graph, p.parent, source=p))


def ir_bundle(p: Path, graph: Graph, locations: Mapping[str, Any]) -> ModelBundle:
    """The bundle of the IR file ``p`` with weight ``locations`` that may lie anywhere; only the weights move, so
    the tokenizer and metadata are still looked for beside ``p``."""
    tok = None
    for cand in (p.parent / "tokenizer.json", p.parent / "tokenizer.model"):
        if cand.is_file():
            tok = _tokenizer({}, p.parent)
            break
    meta = graph.meta
    arch = meta.get("model.architecture", meta.get("general.architecture", "ir"))
    ctx = int(meta.get("context_length", meta.get("model.context_length", "0")) or 0)
    stops = frozenset(int(x) for x in meta.get("eos_token_ids", "").replace(",", " ").split() if x.isdigit())
    info = _info(p, "uaii", arch, dict(meta), graph, locations)
    return ModelBundle(p, "uaii", graph, locations, tok, None, ctx, stops, info, dict(meta))


def ir_locations(graph: Graph, base: Path, *, source: Path | None = None) -> dict[str, Any]:
    """Location of every weight reference of an IR graph, relative to ``base`` (the file's directory).

    ``source``: the IR file, named in the error when a referenced file is missing or not a weight container.
    """
    from uaii.storage import locate_raw_file

    out: dict[str, Any] = {}
    containers: dict[Path, Mapping[str, Any]] = {}
    for t in graph.weights:
        if t.weight is None:
            continue
        ref: WeightRef = t.weight
        key = str(ref)
        if ref.is_raw_file:
            out[key] = locate_raw_file(ref, base, base, dtype=t.dtype, shape=[int(d) for d in t.shape])
            continue
        file = ref.resolve(base, base)
        table = containers.get(file)
        if table is None:
            table = containers[file] = _container(file, source, t.name, key)
        info = table.get(ref.tensor or "")
        if info is None:
            raise SessionError(f"[runtime] {file}: no tensor {ref.tensor!r} (weight {t.name!r} of the graph)")
        out[key] = info.expert(ref.expert) if ref.expert is not None else info
    return out


def weight_container(file: Path) -> Mapping[str, Any] | None:
    """The tensor table (name -> location) of the GGUF, safetensors or ONNX file an IR weight reference names; None for
    another format (each caller reports that in its own terms: the Session, the C API)."""
    from uaii.loaders import open_gguf, open_safetensors
    from uaii.loaders.gguf import is_gguf

    if is_gguf(file):
        return open_gguf(file).tensors
    if file.suffix == ".safetensors":
        return open_safetensors(file).tensors
    if file.suffix.lower() == ".onnx":  # initializers, wherever their bytes are (inline or external data)
        from uaii.loaders import open_onnx

        return open_onnx(file).weights
    return None


def _container(file: Path, source: Path | None, weight: str, ref: str) -> Mapping[str, Any]:
    where = f"{source}: weight {weight!r} references {ref!r}" if source else f"weight reference {ref!r}"
    if not file.is_file():
        missing = "does not exist" if not file.exists() else "is not a file"
        raise SessionError(f"[runtime] {where}, but {file} {missing} (weight paths are relative to the IR file's "
                           "directory; keep the weight files beside it)")
    table = weight_container(file)
    if table is None:
        raise SessionError(f"[runtime] {where}: {file} is not a weight container (expected a GGUF, safetensors or "
                           "ONNX file)")
    return table


__all__ = ["ModelBundle", "ir_bundle", "ir_locations", "is_ir_file", "load_bundle", "weight_container"]
