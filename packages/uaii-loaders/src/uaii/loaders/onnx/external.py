"""External data: the file, offset and length an ONNX tensor's ``external_data`` names, checked before any read.

A model file decides which paths we open, so ``location`` is confined to the model's directory: it must be
relative, free of ``..`` components, NUL bytes and drive letters, and its real path (symlinks followed) must stay
inside the directory and be a regular file. ``offset`` and ``length`` are decimal integers; the range must lie
inside the file and hold exactly the tensor's bytes (without ``length``, the data runs to the end of the file and
must still be exactly that long). Unaligned offsets are fine: the storage layer reads any range. ``checksum`` is
not verified (it would mean reading every weight at load time); unknown keys are ignored, as onnx does.

The directory's real path is the sandbox: a model whose data sits beside it through symlinks that lead elsewhere
(the Hugging Face hub cache links ``snapshots/<rev>/model.onnx_data`` to ``blobs/``) is refused by the rule
against symlinks leading out.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from uaii.ir import FormatError

_DECIMAL = re.compile(r"[0-9]{1,20}")
_DRIVE = re.compile(r"[A-Za-z]:")
_KEYS = ("location", "offset", "length", "checksum")


@dataclass(frozen=True, slots=True)
class Span:
    """``nbytes`` bytes at ``offset`` in ``file`` (a real path inside the sandbox)."""

    file: str
    offset: int
    nbytes: int


class Sandbox:
    """The model directory, and the files in it that external data names (each resolved and stat'ed once)."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.root = os.path.realpath(os.path.dirname(model_path))
        self._files: dict[str, tuple[str, int]] = {}

    def fail(self, label: str, location: str | None, what: str, where: int | None) -> NoReturn:
        loc = f" (external data location {location!r})" if location is not None else ""
        raise FormatError(f"{label}{loc}: {what}", path=self.model_path, offset=where, component="onnx")

    def span(self, label: str, entries: Sequence[tuple[str, str, int | None]], nbytes: int, need: str,
             where: int | None) -> Span:
        """Where ``label``'s ``nbytes`` bytes (``need`` says of what) are, from its external_data entries."""
        keys: dict[str, str] = {}
        for key, value, _ in entries:
            if key in keys and key in _KEYS:
                self.fail(label, keys.get("location"), f"external_data gives {key!r} twice", where)
            keys[key] = value
        location = keys.get("location")
        if location is None:
            self.fail(label, None, "external_data has no 'location'", where)
        offset = self._integer(label, location, keys, "offset", where)
        length = self._integer(label, location, keys, "length", where)
        real, size = self.resolve(label, location, where)
        start = offset or 0
        if start > size:
            self.fail(label, location, f"offset {start} is past the end of {real} ({size} bytes)", where)
        if length is None:
            if size - start != nbytes:
                self.fail(label, location, f"no length is given, so the data runs from offset {start} to the end "
                          f"of {real}: {size - start} bytes, but {need} needs {nbytes}", where)
            length = nbytes
        elif length != nbytes:
            self.fail(label, location, f"length is {length} bytes, but {need} needs {nbytes}", where)
        if start + length > size:
            self.fail(label, location, f"offset {start} + length {length} runs past the end of {real} "
                      f"({size} bytes)", where)
        return Span(real, start, length)

    def _integer(self, label: str, location: str, keys: dict[str, str], key: str, where: int | None) -> int | None:
        text = keys.get(key)
        if text is None:
            return None
        if not _DECIMAL.fullmatch(text):
            self.fail(label, location, f"{key} is {text[:40]!r}, expected a non-negative decimal integer", where)
        return int(text)

    def resolve(self, label: str, location: str, where: int | None) -> tuple[str, int]:
        """(real path, size) of ``location``, or a FormatError saying why it may not be read."""
        known = self._files.get(location)
        if known is not None:
            return known
        if not location:
            self.fail(label, location, "location is empty", where)
        if "\x00" in location:
            self.fail(label, location, "location contains a NUL byte", where)
        if location.startswith(("/", "\\")) or _DRIVE.match(location) or os.path.isabs(location):
            self.fail(label, location, "location is an absolute path; external data must be named relative to "
                      f"the model directory {self.root}", where)
        if ".." in re.split(r"[/\\]", location):
            self.fail(label, location, "location has a '..' component; external data must stay inside the "
                      f"model directory {self.root}", where)
        try:
            real = os.path.realpath(os.path.join(self.root, location))
        except (OSError, ValueError) as exc:
            self.fail(label, location, f"cannot resolve the location: {exc}", where)
        if real == self.root or os.path.commonpath([self.root, real]) != self.root:
            self.fail(label, location, f"location resolves to {real}, outside the model directory {self.root} "
                      "(a symbolic link leads out)", where)
        try:
            st = os.stat(real)
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.fail(label, location, f"cannot open {real}: {reason}", where)
        if not stat.S_ISREG(st.st_mode):
            self.fail(label, location, f"{real} is not a regular file", where)
        self._files[location] = (real, st.st_size)
        return real, st.st_size

    def read(self, label: str, span: Span, where: int | None) -> bytes:
        data = read_exact(span.file, span.offset, span.nbytes)
        if len(data) != span.nbytes:
            self.fail(label, None, f"{span.file} ended after {len(data)} of the {span.nbytes} bytes at offset "
                      f"{span.offset} (did it change while loading?)", where)
        return data


def read_exact(path: str, offset: int, nbytes: int) -> bytes:
    """``nbytes`` at ``offset`` (fewer only when the file is shorter); pread in pieces, as Linux caps one read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts: list[bytes] = []
        got = 0
        while got < nbytes:
            chunk = os.pread(fd, min(nbytes - got, 1 << 30), offset + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


__all__ = ["Sandbox", "Span", "read_exact"]
