"""`load(path)`: find the tokenizer format of a file or directory and build its tokenizer.

Formats register through the entry-point group ``uaii.tokenizers``; the built-in ones below are declared there by
this package's pyproject.toml, so a plugin format is found the same way. Each entry point names a
`TokenizerFormat`: a `probe` that says whether a path is its kind and a `load` that builds the tokenizer. Probes run
in `priority` order (lower first); the first that accepts the path loads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from uaii.ir.errors import UaiiError
from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.tokenizer import Tokenizer

ENTRY_POINT_GROUP = "uaii.tokenizers"


@dataclass(frozen=True)
class TokenizerFormat:
    """One tokenizer file format: how to recognise it and how to load it."""

    name: str
    description: str
    probe: Callable[[Path], bool]
    load: Callable[[Path], Tokenizer]
    priority: int = 50


def _is_gguf(path: Path) -> bool:
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _load_gguf(path: Path) -> Tokenizer:
    from uaii.tokenizers.gguf import load_gguf
    return load_gguf(path)


def _has(name: str, *suffixes: str) -> Callable[[Path], bool]:
    def probe(path: Path) -> bool:
        if path.is_dir():
            return (path / name).is_file()
        return path.is_file() and (path.name == name or path.suffix.lower() in suffixes)
    return probe


def _load_json(path: Path) -> Tokenizer:
    from uaii.tokenizers.hf import load_tokenizer_json
    return load_tokenizer_json(path)


def _load_spm(path: Path) -> Tokenizer:
    from uaii.tokenizers.hf import load_sentencepiece
    return load_sentencepiece(path)


def _load_vocab(path: Path) -> Tokenizer:
    from uaii.tokenizers.simple import load_vocab_file
    return load_vocab_file(path)


GGUF_FORMAT = TokenizerFormat("gguf", "a .gguf model file (tokenizer.ggml.model gpt2, llama or bert)",
                              _is_gguf, _load_gguf, priority=10)
TOKENIZER_JSON_FORMAT = TokenizerFormat("tokenizer.json", "an HF directory with tokenizer.json (or the file)",
                                        _has("tokenizer.json", ".json"), _load_json, priority=20)
SENTENCEPIECE_FORMAT = TokenizerFormat("sentencepiece", "a SentencePiece .model file or a directory with "
                                       "tokenizer.model", _has("tokenizer.model", ".model"), _load_spm, priority=30)
VOCAB_FORMAT = TokenizerFormat("vocab.txt", "a vocabulary with one token per line (vocab.txt: WordPiece or simple)",
                               _has("vocab.txt", ".txt"), _load_vocab, priority=40)
BUILTIN_FORMATS = (GGUF_FORMAT, TOKENIZER_JSON_FORMAT, SENTENCEPIECE_FORMAT, VOCAB_FORMAT)


@lru_cache(maxsize=1)
def formats() -> tuple[TokenizerFormat, ...]:
    """Every registered format, by priority: the entry points of `uaii.tokenizers` (built-ins included)."""
    found: dict[str, TokenizerFormat] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        fmt = ep.load()
        if not isinstance(fmt, TokenizerFormat):
            raise TokenizerError(f"entry point {ep.name!r} of {ENTRY_POINT_GROUP} is not a TokenizerFormat")
        found.setdefault(fmt.name, fmt)
    for fmt in BUILTIN_FORMATS:          # only when the package metadata is missing (running from a source tree)
        found.setdefault(fmt.name, fmt)
    return tuple(sorted(found.values(), key=lambda f: (f.priority, f.name)))


def supported() -> str:
    """One line per format, for error messages."""
    return "; ".join(f"{f.name}: {f.description}" for f in formats())


def load(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of a model file (.gguf) or directory (tokenizer.json, tokenizer.model, vocab.txt).

    Raises `TokenizerError` for a missing path or an unrecognised one (naming what is supported) and
    `TokenizerFormatError` (path, and byte offset where the format gives one) for a truncated or corrupt file.
    """
    p = Path(os.fspath(path))
    if not p.exists():
        raise TokenizerError(f"{p}: no such file or directory; supported: {supported()}")
    try:
        fmt = next((f for f in formats() if f.probe(p)), None)
    except OSError as exc:
        raise TokenizerError(f"{p}: cannot read ({exc.strerror})") from None
    if fmt is None:
        raise TokenizerError(f"{p}: no tokenizer found; supported: {supported()}")
    return _guarded(p, fmt.name, lambda: fmt.load(p))


def from_gguf_metadata(metadata: Mapping[str, Any], path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of a GGUF file whose key/value metadata is already parsed (by uaii.loaders' reader).

    The vocabulary arrays are then shared with that metadata instead of being read from the file and held twice
    (for Gemma 3, 5 MiB and 0.1 s saved). `metadata` is the reader's: string arrays as `StringTable`s or lists,
    numeric arrays as numpy arrays.
    """
    from uaii.tokenizers.gguf import from_metadata

    p = Path(os.fspath(path))
    return _guarded(p, GGUF_FORMAT.name, lambda: from_metadata(dict(metadata), str(p)))


def _guarded(p: Path, name: str, build: Callable[[], Tokenizer]) -> Tokenizer:
    """Run a loader; anything but a UaiiError becomes a `TokenizerFormatError` that names the path."""
    try:
        return build()
    except UaiiError:
        raise
    except MemoryError:
        raise TokenizerFormatError("tokenizer data too large to load (corrupt sizes?)", path=str(p)) from None
    except Exception as exc:
        raise TokenizerFormatError(f"cannot load {name} tokenizer: {type(exc).__name__}: {exc}",
                                   path=str(p)) from exc
