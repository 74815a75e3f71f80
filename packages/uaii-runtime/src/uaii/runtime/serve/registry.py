"""The models a server may load: a directory scanned once into ``name -> file``, looked up by name only.

A GGUF file is named by its stem (``SmolLM2-135M.Q4_1.gguf`` -> ``SmolLM2-135M.Q4_1``), a Hugging Face model
directory (one holding ``config.json``) and a ``.uaii``/``.uaii.json`` IR file by their own names. A request's
``model`` is a key of that table and nothing else: it never becomes part of a path, so ``../x``, ``/etc/passwd``,
names with NUL or a separator are simply unknown (404), and no request makes the server stat or open a file it
did not list at start. ``uaii serve MODEL`` is a registry of one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import ApiError, ServeError

MAX_NAME = 256  # characters; longer names are unknown without a lookup


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    kind: str  # "gguf" | "hf" | "uaii"
    size_bytes: int

    @property
    def mtime(self) -> float:
        """When the model file changed last (OpenAI's ``created``); 0 when it is gone."""
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0


def model_name(path: Path) -> str | None:
    """The name ``path`` is served under, or None when it is not a model file or directory."""
    if path.is_dir():
        return path.name if (path / "config.json").is_file() else None
    lower = path.name.lower()
    for suffix in (".gguf", ".uaii.json", ".uaii"):
        if lower.endswith(suffix) and len(path.name) > len(suffix):
            return path.name[: -len(suffix)] if suffix == ".gguf" else path.name
    return None


def _kind(path: Path) -> str:
    if path.is_dir():
        return "hf"
    return "gguf" if path.name.lower().endswith(".gguf") else "uaii"


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


class ModelRegistry:
    """``name -> ModelEntry`` for one model file/directory or every model directly inside a directory."""

    def __init__(self, entries: list[ModelEntry]) -> None:
        self._entries = {e.name: e for e in entries}

    @classmethod
    def of_model(cls, path: str | Path) -> ModelRegistry:
        p = Path(path).expanduser().resolve()
        name = model_name(p) or p.name
        return cls([ModelEntry(name, p, _kind(p), _size(p))])

    @classmethod
    def of_directory(cls, directory: str | Path) -> ModelRegistry:
        d = Path(directory).expanduser().resolve()
        if not d.is_dir():
            raise ServeError(f"[serve] models directory {d}: not a directory")
        entries = []
        for child in sorted(d.iterdir()):
            name = model_name(child)
            if name is not None:
                entries.append(ModelEntry(name, child, _kind(child), _size(child)))
        return cls(entries)

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def get(self, name: object) -> ModelEntry:
        """The entry called ``name`` (a dict lookup, nothing else), else a 404 ``model_not_found``."""
        entry = self._entries.get(name) if isinstance(name, str) and len(name) <= MAX_NAME else None
        if entry is None:
            shown = repr(name)[:80] if isinstance(name, str) else type(name).__name__
            raise ApiError(404, f"[serve] the model {shown} does not exist; this server has "
                                f"{', '.join(self._entries) or 'no models'} (GET /v1/models)",
                           code="model_not_found", param="model")
        return entry


__all__ = ["ModelEntry", "ModelRegistry", "model_name"]
