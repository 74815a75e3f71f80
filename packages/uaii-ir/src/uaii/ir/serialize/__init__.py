"""Reading and writing UAII IR files: the canonical ``.uaii.json`` text and the ``.uaii`` binary.

* :func:`dumps_json` / :func:`loads_json` — canonical JSON (same graph → same bytes; see ``json_codec``).
* :func:`to_bytes` / :func:`from_bytes` — the binary: writes codec 2 (FlatBuffers), reads codecs 1 and 2.
* :func:`save` / :func:`load` — files, the format chosen by extension (``.uaii.json`` or ``.json`` → text,
  ``.uaii`` → binary). :func:`save` writes a temporary file, fsyncs it and renames it into place.

Corrupt or truncated input raises :class:`uaii.ir.FormatError` with the file path and the byte offset where
decoding failed; graphs a file cannot represent raise :class:`uaii.ir.GraphError` before anything is written.
The layouts are documented in ``docs/formats.md``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Literal

from uaii.ir.errors import FormatError, UaiiError
from uaii.ir.graph import Graph
from uaii.ir.serialize.binary_v1 import read_codec1
from uaii.ir.serialize.binary_v2 import read_codec2, write_codec2
from uaii.ir.serialize.json_codec import dumps_json, loads_json
from uaii.ir.serialize.reader import read_header

CODEC_VERSION = 2
"""The binary codec :func:`to_bytes` writes."""
READ_CODECS = (1, 2)

FileFormat = Literal["json", "binary"]


def file_format(path: str | os.PathLike[str]) -> FileFormat:
    """``"json"`` for ``*.uaii.json`` / ``*.json``, ``"binary"`` for ``*.uaii``; UaiiError otherwise."""
    name = os.fspath(path).lower()
    if name.endswith(".json"):
        return "json"
    if name.endswith(".uaii"):
        return "binary"
    raise UaiiError(f"[ir] {os.fspath(path)}: unknown IR file extension; expected .uaii.json, .json or .uaii")


def to_bytes(graph: Graph) -> bytes:
    """The ``.uaii`` binary of ``graph`` in codec 2; byte-deterministic."""
    return write_codec2(graph)


def from_bytes(data: bytes | bytearray | memoryview, *, path: str | None = None) -> Graph:
    """Read a ``.uaii`` binary of codec 1 or 2."""
    data = bytes(data)
    header = read_header(data, path)
    if header.codec == 1:
        return read_codec1(data, header, path)
    if header.codec == 2:
        return read_codec2(data, header, path)
    raise FormatError(f"codec version {header.codec} is not supported; this reader reads codecs "
                      f"{READ_CODECS}", path=path, offset=4, component="uaii")


def encode(graph: Graph, fmt: FileFormat) -> bytes:
    return dumps_json(graph).encode("utf-8") if fmt == "json" else to_bytes(graph)


def decode(data: bytes, fmt: FileFormat, *, path: str | None = None) -> Graph:
    return loads_json(data, path=path) if fmt == "json" else from_bytes(data, path=path)


def save(graph: Graph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` to ``path`` atomically, in the format its extension names."""
    data = encode(graph, file_format(path))
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike[str]) -> Graph:
    """Read a ``.uaii.json`` / ``.json`` / ``.uaii`` file (the format chosen by extension)."""
    fmt = file_format(path)
    return decode(Path(path).read_bytes(), fmt, path=os.fspath(path))


__all__ = ["CODEC_VERSION", "READ_CODECS", "FileFormat", "decode", "dumps_json", "encode", "file_format",
           "from_bytes", "load", "loads_json", "save", "to_bytes"]
