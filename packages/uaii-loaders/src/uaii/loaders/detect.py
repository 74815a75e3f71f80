"""Why a path is not a model this installation can open — said by the loader that should have opened it.

A loader's ``detect(path)`` only answers yes or no. When every loader says no, the user needs to know what was
found: an empty ``.gguf`` is a broken GGUF, not an unknown format; a lone ``.safetensors`` lacks the config.json
beside it. So a loader may also have ``explain(path) -> Mismatch`` (an optional slot of the loader protocol):

- ``claimed=True``: the path's extension or content is this loader's format (``.gguf``, the GGUF magic, a
  ``.safetensors`` file, a directory of safetensors shards). Its error alone is what the user sees.
- ``claimed=False``: one reason among the reasons of every loader, listed together when nothing matches.

A loader without ``explain`` counts as "did not recognize it".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uaii.ir import UaiiError

from .errors import LoaderError
from .gguf import is_gguf, open_gguf
from .safetensors import INDEX_NAME

IR_SUFFIXES = (".uaii", ".uaii.json")
_MAX_LISTED = 8


@dataclass(frozen=True)
class Mismatch:
    """A loader's reason for not opening a path (module docstring)."""

    error: UaiiError
    claimed: bool = False


def listing(names: Iterable[str]) -> str:
    """``a, b, c`` — at most a few names, then how many more."""
    names = sorted(names)
    shown = ", ".join(names[:_MAX_LISTED])
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def is_first_shard(p: Path) -> bool:
    """A single GGUF file, or the first of a split one (``model-00001-of-00003.gguf``)."""
    return "-of-" not in p.name or p.name.split("-of-")[0].endswith("-00001")


def gguf_models(directory: Path) -> list[Path]:
    """The GGUF models in ``directory``, sorted: single files and first shards with the GGUF magic (the name is
    looked at first; only a file that passes it is opened)."""
    return sorted(p for p in directory.glob("*.gguf") if is_first_shard(p) and is_gguf(p))


def explain_gguf(path: Path) -> Mismatch:
    """A ``.gguf`` file (or a file with the GGUF magic) is claimed; the reader says what is wrong with it."""
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        magic = {p: is_gguf(p) for p in files}  # each file opened once
        models = [p for p in files if magic[p] and is_first_shard(p)]
        if len(models) > 1:
            return Mismatch(LoaderError(f"{path}: {len(models)} GGUF models ({listing(p.name for p in models)}); "
                                        "pass the file to load"), claimed=True)
        broken = [p for p in files if not magic[p]]
        if broken:
            return Mismatch(_reader_error(broken[0]), claimed=True)
        return Mismatch(LoaderError(f"{path}: no *.gguf file in the directory"))
    return Mismatch(_reader_error(path), claimed=path.suffix.lower() == ".gguf")


def _reader_error(path: Path) -> UaiiError:
    try:
        open_gguf(path)
    except UaiiError as exc:
        return exc
    return LoaderError(f"{path}: a GGUF file, but no GGUF model could be found in it")  # detect said no: unlikely


def explain_hf(path: Path) -> Mismatch:
    """A directory with safetensors, a ``.safetensors`` file or an index file is claimed: config.json is what is
    missing (the architecture and sizes), and the message lists what is there instead."""
    need = "a Hugging Face model directory needs config.json (architecture and sizes) beside its *.safetensors"
    if path.is_dir():
        names = [p.name for p in path.iterdir()]
        found = f"it holds {listing(names)}" if names else "the directory is empty"
        claimed = any(n.endswith(".safetensors") or n == INDEX_NAME for n in names)
        return Mismatch(LoaderError(f"[hf] {path}: no config.json; {need}; {found}"), claimed)
    if path.suffix == ".safetensors" or path.name == INDEX_NAME:
        names = [p.name for p in path.parent.iterdir()]
        return Mismatch(LoaderError(
            f"[hf] {path}: no config.json beside it in {path.parent}; a safetensors file holds only tensors: {need} "
            f"(the directory holds {listing(names)})"), claimed=True)
    if path.name == "config.json":
        return Mismatch(LoaderError(f"[hf] {path}: pass the model directory {path.parent}, not its config.json"),
                        claimed=True)
    return Mismatch(LoaderError(f"[hf] {path}: not a directory with config.json, nor a .safetensors file"))


def unrecognized(path: Path, loaders: Sequence[Any]) -> UaiiError:
    """The error for a path no loader detected: the claiming loader's own, else every loader's reason."""
    if path.name.lower().endswith(IR_SUFFIXES):
        return LoaderError(f"{path} is a UAII IR graph, not a model file: open it with uaii.runtime.Session "
                           "(`uaii run`, `uaii plan`) or uaii.ir.load")
    found = [(ld.name, _explain(ld, path)) for ld in loaders]
    claimed = [m for _, m in found if m.claimed]
    if len(claimed) == 1:
        return claimed[0].error
    reasons = "".join(f" — {name}: {_reason(m.error, path)}" for name, m in found)
    return LoaderError(f"{path}: format not recognized{reasons}")


def _explain(loader: Any, path: Path) -> Mismatch:
    explain = getattr(loader, "explain", None)
    if explain is None:
        return Mismatch(LoaderError("did not recognize it"))
    try:
        return explain(path)
    except Exception as exc:  # a plugin's explain must not hide the other loaders' reasons
        return Mismatch(LoaderError(f"could not say why ({type(exc).__name__}: {exc})"))


def _reason(error: UaiiError, path: Path) -> str:
    """The error's text without its component and without the path the whole message already starts with."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error))
    for prefix in (f"{path}: ", f"{path.resolve()}: "):
        text = text.removeprefix(prefix)
    return text


__all__ = ["IR_SUFFIXES", "Mismatch", "explain_gguf", "explain_hf", "gguf_models", "is_first_shard", "listing",
           "unrecognized"]
