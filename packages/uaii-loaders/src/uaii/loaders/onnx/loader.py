"""ONNXLoader: a ``.onnx`` file (or a directory holding one) -> LoadedModel.

The file layer reads the graph without the weights' bytes (:mod:`.reader`), the importer translates it
(:mod:`.importer`), the KV mapping rewrites a causal LM's cache I/O to the IR's convention when it has one
(:mod:`.kv`), and the result is validated. Weights are references into the .onnx file or its external-data files,
indexed under ``<model>.onnx#<initializer>`` so that a converted ``.uaii`` graph finds them again through the .onnx.
The config describes only what is known: the architecture is ``onnx`` (the graph is translated op by op, no
builder ran); sizes come from a ``config.json`` beside the model when there is one (Optimum exports), else 0.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from uaii.ir import FormatError, Graph, UaiiError

from ..detect import Mismatch
from ..errors import LoaderError
from ..hf import TOKENIZER_FILES
from ..hf import _chat_template as hf_chat_template
from ..index import WeightIndex
from ..model import LoadedModel, check_graph

MAX_JSON_BYTES = 16 << 20
MAX_TEMPLATE_BYTES = 1 << 20
"""A chat template is a few KiB of Jinja; a file of megabytes is not one."""
log = logging.getLogger(__name__)


def onnx_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.suffix.lower() == ".onnx" and p.is_file())
    except OSError:
        return []


def single_onnx(path: Path) -> Path | None:
    """The model file of ``path``: the file itself, or a directory's ``model.onnx`` or only ``*.onnx``."""
    if path.is_file():
        return path if path.suffix.lower() == ".onnx" else None
    if path.is_dir():
        if any(p.suffix == ".safetensors" for p in path.iterdir()):
            return None  # a Hugging Face directory that also holds an export: the HF loader opens it
        if (path / "model.onnx").is_file():
            return path / "model.onnx"
        found = onnx_files(path)
        return found[0] if len(found) == 1 else None
    return None


def _read_json(path: Path) -> Any:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise FormatError(f"[onnx] {path}: larger than {MAX_JSON_BYTES} bytes")
        return json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise FormatError(f"[onnx] {path}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"[onnx] {path}: not valid JSON: {str(exc)[:200]}") from None


def model_config(directory: Path, graph: Graph) -> Any:
    """What is known about the model: a config.json's sizes when present, the architecture ``onnx``."""
    from ..config import ModelConfig
    from ..hf_config import from_hf

    told = graph.meta.get("context_length", "0")  # the KV mapping reads it off the rotary caches
    base = ModelConfig(architecture="onnx", source="onnx", n_layers=0, d_model=0, n_heads=0, n_kv_heads=0,
                       head_dim=0, d_ff=0, vocab_size=_vocab(graph),
                       context_length=int(told) if told.isdigit() else 0, norm_eps=0.0)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        return base
    doc = _read_json(cfg_path)
    if not isinstance(doc, dict):
        return base
    try:
        hf = from_hf(doc, where=str(cfg_path))
    except UaiiError as exc:  # an unknown model_type: the graph still runs, the config just says less
        return base.with_(extra={"config.json": f"not used: {exc}"})
    keep = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size", "context_length",
            "norm_eps", "rope", "sliding_window", "sliding_layers", "bos_token_id", "eos_token_ids")
    known = {k: getattr(hf, k) for k in keep}
    if not known["context_length"]:
        known["context_length"] = base.context_length
    return base.with_(**known, extra={"hf.architecture": hf.architecture})


def _vocab(graph: Graph) -> int:
    """The logits' last dim when the graph has a ``logits`` output of static width (0: unknown)."""
    if "logits" in graph.outputs:
        last = graph.tensor("logits").shape[-1:]
        if last and isinstance(last[0], int):
            return int(last[0])
    return 0


def _tokenizer(directory: Path) -> tuple[dict[str, Path], str | None]:
    """The tokenizer files beside the model (the Hugging Face roles, as an Optimum export has them) and the chat
    template they hold, read as the Hugging Face loader reads it; a template that is not small UTF-8 text is a
    FormatError naming the file."""
    files = {role: directory / name for name, role in TOKENIZER_FILES.items() if (directory / name).is_file()}
    jinja = files.get("chat_template")
    if jinja is not None:
        try:
            size = jinja.stat().st_size
        except OSError as exc:
            raise FormatError(f"cannot read: {exc.strerror or exc}", path=str(jinja), component="onnx") from None
        if size > MAX_TEMPLATE_BYTES:
            raise FormatError(f"larger than {MAX_TEMPLATE_BYTES} bytes; not a chat template", path=str(jinja),
                              offset=0, component="onnx")
    try:
        return files, hf_chat_template(files)
    except UnicodeDecodeError as exc:
        raise FormatError(f"not UTF-8 text ({exc.reason})", path=str(jinja), offset=exc.start,
                          component="onnx") from None
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=str(jinja), component="onnx") from None


def _import(f: Any, name: str) -> Any:
    """Import ``f``, through the KV-cache mapping of a causal LM (:mod:`.kv`) where this tree has it: the mapping
    rewrites the ONNX graph before import and checks its work after (it sets graph metadata ``onnx.kv``)."""
    import importlib.util

    from .importer import import_graph, refuse_internal

    refuse_internal(f.model, Path(f.path).name)  # before the mapping adds its own uaii.kv nodes
    if importlib.util.find_spec(f"{__package__}.kv") is None:
        return import_graph(f, name=name)
    from importlib import import_module

    plan = import_module(f"{__package__}.kv").prepare_kv(f)
    return plan.finish(import_graph(plan.file, name=name, internal=plan.mapped))


class ONNXLoader:
    name = "onnx"
    priority = 30  # above hf: an Optimum directory has a config.json but no safetensors (single_onnx checks)

    def detect(self, path: Path) -> bool:
        return single_onnx(path) is not None

    def explain(self, path: Path) -> Mismatch:
        if path.is_dir():
            found = onnx_files(path)
            if len(found) > 1 and not (path / "model.onnx").is_file():
                names = ", ".join(p.name for p in found[:5])
                return Mismatch(LoaderError(f"{path}: {len(found)} .onnx files ({names}); open one of them"),
                                claimed=True)
            if found:  # beside safetensors: the Hugging Face loader's directory
                return Mismatch(LoaderError("the directory holds safetensors too (a Hugging Face directory)"))
            return Mismatch(LoaderError("no *.onnx file in the directory"))
        if path.suffix.lower() == ".onnx":
            return Mismatch(LoaderError("not a regular file"), claimed=True)
        return Mismatch(LoaderError("not a .onnx file"))

    def load(self, path: Path, *, validate: bool = True, **_: Any) -> LoadedModel:
        from .reader import open_onnx

        file = single_onnx(path)
        if file is None:
            raise LoaderError(f"{path}: no ONNX model found")
        f = open_onnx(file)
        imported = _import(f, file.parent.name if file.stem == "model" else file.stem)
        graph = imported.graph
        if validate:
            check_graph(graph, source=str(file))
        for note in imported.notes:  # what the import approximated or ignored: said, not only stored
            log.warning("%s", note)
        # weights are named after the real file (open_onnx follows links); the files beside the model are looked
        # up where the user pointed: a Hugging Face hub snapshot links each file to its own blob
        index = WeightIndex(Path(f.path).parent, imported.weights)
        directory = file.parent
        files, template = _tokenizer(directory)
        cfg = model_config(directory, graph)
        meta: dict[str, Any] = {"onnx.producer": graph.meta.get("onnx.producer", ""),
                                "onnx.opsets": ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(f.opsets.items()))}
        meta.update(_metadata_props(f.model))
        if imported.notes:
            meta["onnx.import_notes"] = "\n".join(imported.notes)
        return LoadedModel(path, Path(f.path).parent, "onnx", cfg, graph, index, files, template, meta)


def _metadata_props(model: Any) -> Mapping[str, str]:
    return {f"onnx.meta.{p.key}": p.value for p in getattr(model, "metadata_props", ())}


ONNX_LOADER = ONNXLoader()

__all__ = ["ONNX_LOADER", "ONNXLoader", "model_config", "single_onnx"]
