"""safetensors reader, single files and sharded models (``model.safetensors.index.json``).

The header is parsed here (8-byte little-endian length, then JSON); no dependency on the safetensors package.
Validation follows the reference implementation: the header is at most 100 MB, UTF-8 and starts with ``{``;
every tensor has exactly ``dtype``, ``shape`` and ``data_offsets``; sorted by offset, the tensors tile the
data section with no gap or overlap, each one's byte count equals dtype × shape, and the last one ends exactly
at the end of the file. Names are unique (duplicate JSON keys are an error, not "last one wins").
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from uaii.ir import DType, FormatError, UaiiError

from .index import TensorInfo

MAX_HEADER_BYTES = 100_000_000
INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype → (UAII dtype or None when known but not supported, bits per element)
_DTYPES: dict[str, tuple[DType | None, int]] = {
    "F64": (DType.F64, 64), "F32": (DType.F32, 32), "F16": (DType.F16, 16), "BF16": (DType.BF16, 16),
    "I64": (DType.I64, 64), "I32": (DType.I32, 32), "I16": (DType.I16, 16), "I8": (DType.I8, 8),
    "U8": (DType.U8, 8), "U32": (DType.U32, 32), "BOOL": (DType.BOOL, 8),
    "U16": (None, 16), "U64": (None, 64), "F8_E4M3": (None, 8), "F8_E5M2": (None, 8), "F8_E8M0": (None, 8),
    "F4": (None, 4), "F6_E2M3": (None, 6), "F6_E3M2": (None, 6), "C64": (None, 64),
}


def _fail(message: str, path: str, offset: int | None = None) -> NoReturn:
    raise FormatError(message, path=path, offset=offset, component="safetensors")


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(repr(k))
        out[k] = v
    return out



@dataclass
class SafetensorsFile:
    """One parsed safetensors file: tensors with absolute offsets, and the ``__metadata__`` strings."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    header_size: int


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                           for x in value)


def _entry(name: str, spec: Any, path: str, data_start: int) -> tuple[TensorInfo, int, int]:
    if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= set(spec):
        keys = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        _fail(f"tensor {name!r}: expected keys dtype, shape, data_offsets; found {keys}", path, 8)
    dt, shape, offs = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dt, str) or dt not in _DTYPES:
        _fail(f"tensor {name!r}: unknown dtype {dt!r}", path, 8)
    if not _int_list(shape):
        _fail(f"tensor {name!r}: shape must be a list of non-negative integers, found {shape!r}", path, 8)
    if not _int_list(offs) or len(offs) != 2 or offs[1] < offs[0]:
        _fail(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end, found {offs!r}",
              path, 8)
    dtype, bits = _DTYPES[dt]
    n = 1
    for d in shape:
        n *= d
    nbits = n * bits
    begin, end = offs
    if nbits % 8 or nbits // 8 != end - begin:
        _fail(f"tensor {name!r}: {end - begin} bytes, but dtype {dt} x shape {shape} needs {nbits / 8:g}",
              path, data_start + begin)
    if dtype is None:
        _fail(f"tensor {name!r} has dtype {dt}, which UAII does not support (supported: BF16, F16, F32, F64, "
              "I8, I16, I32, I64, U8, U32, BOOL)", path, data_start + begin)
    return TensorInfo(name, dtype, tuple(shape), path, data_start + begin, end - begin), begin, end


def parse_header(raw: bytes, file_size: int, path: str) -> SafetensorsFile:
    """Validate a header (``raw`` holds at least the first 8 + N bytes of the file)."""
    if file_size < 8:
        _fail(f"file is {file_size} bytes; a safetensors file starts with an 8-byte header length", path, 0)
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > MAX_HEADER_BYTES:
        _fail(f"header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes", path, 0)
    if n > file_size - 8:
        _fail(f"header length {n} runs past the end of the file (size {file_size})", path, 0)
    try:
        text = raw[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail("header is not valid UTF-8", path, 8 + exc.start)
    if not text.startswith("{"):
        _fail(f"header must start with '{{', found {text[:1]!r}", path, 8)
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except _Duplicate as exc:
        _fail(f"header names {exc} twice (duplicate key)", path, 8)
    except (ValueError, RecursionError) as exc:
        _fail(f"header is not valid JSON: {str(exc)[:200]}", path, 8)
    if not isinstance(header, dict):
        _fail("header must be a JSON object", path, 8)
    meta = header.pop("__metadata__", None)
    meta = {} if meta is None else meta
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        _fail("__metadata__ must map strings to strings", path, 8)

    data_start = 8 + n
    entries = [_entry(name, spec, path, data_start) for name, spec in header.items()]
    entries.sort(key=lambda e: (e[1], e[2]))
    pos = 0
    for info, begin, end in entries:
        if begin != pos:
            what = "leaves a gap before it" if begin > pos else "overlaps the previous tensor"
            _fail(f"tensor {info.name!r}: data_offsets begin at {begin}, expected {pos}; it {what}",
                  path, data_start + begin)
        pos = end
    if data_start + pos != file_size:
        _fail(f"tensors end at byte {data_start + pos}, but the file has {file_size} bytes", path,
              min(data_start + pos, file_size))
    return SafetensorsFile(Path(path), {e[0].name: e[0] for e in entries}, dict(meta), n)


def open_file(path: str | os.PathLike[str]) -> SafetensorsFile:
    """Parse and validate one safetensors file."""
    p = str(Path(path).resolve())
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                _fail(f"file is {size} bytes; a safetensors file starts with an 8-byte header length", p, 0)
            (n,) = struct.unpack("<Q", head)
            raw = head + (f.read(n) if n <= min(MAX_HEADER_BYTES, size - 8) else b"")
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=p, component="safetensors") from None
    try:
        return parse_header(raw, size, p)
    except UaiiError:
        raise
    except (ValueError, OverflowError, MemoryError, RecursionError, struct.error) as exc:
        _fail(f"malformed safetensors file: {exc}", p)


@dataclass
class SafetensorsModel:
    """All tensors of a single-file or sharded safetensors model."""

    path: Path  # the .safetensors file, or the index json
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    files: tuple[Path, ...]


def _safe_shard(directory: Path, name: Any, index_path: str, component: str) -> Path:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") \
            or "\x00" in name:
        raise FormatError(f"weight_map names shard {name!r}; expected a plain file name in the same directory",
                          path=index_path, component=component)
    return directory / name


def read_weight_map(path: Path, component: str = "safetensors") -> dict[str, Path]:
    """A sharded model's index json (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``): its
    ``weight_map`` as tensor -> shard, every shard a plain file name in the index's directory that exists. At most
    :data:`MAX_HEADER_BYTES`; duplicate keys are an error. ``component`` names the format in errors."""
    p = Path(path).resolve()
    where = str(p)
    try:
        size = p.stat().st_size
        if size > MAX_HEADER_BYTES:
            raise FormatError(f"index is {size} bytes, more than the limit of {MAX_HEADER_BYTES}", path=where,
                              offset=0, component=component)
        doc = json.loads(p.read_text("utf-8"), object_pairs_hook=_no_duplicates)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=where, component=component) from None
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"index is not valid JSON: {str(exc)[:200]}", path=where, offset=0,
                          component=component) from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise FormatError("index has no 'weight_map' object", path=where, offset=0, component=component)
    out = {name: _safe_shard(p.parent, shard, where, component) for name, shard in wmap.items()}
    for s in sorted(set(out.values())):
        if not s.is_file():
            raise FormatError(f"shard {s.name} named by the index does not exist", path=where, component=component)
    return out


def merge_shards(wmap: dict[str, Path], shards: dict[Path, dict[str, TensorInfo]],
                 component: str = "safetensors") -> dict[str, TensorInfo]:
    """The tensors of every shard in one map: a tensor in two shards, or one the index maps to a shard that does
    not hold it, is an error."""
    tensors: dict[str, TensorInfo] = {}
    for s, found in shards.items():
        for name, info in found.items():
            if name in tensors:
                raise FormatError(f"tensor {name!r} appears in {Path(tensors[name].file).name} and {s.name}",
                                  path=str(s), offset=info.offset, component=component)
            tensors[name] = info
    for name, owner in wmap.items():
        if name not in shards[owner]:
            raise FormatError(f"index maps tensor {name!r} to {owner.name}, which does not contain it",
                              path=str(owner), component=component)
    return tensors


def open_index(path: str | os.PathLike[str]) -> SafetensorsModel:
    """A sharded model: the index json's ``weight_map`` (tensor → shard) and every shard it names."""
    p = Path(path).resolve()
    wmap = read_weight_map(p)
    parsed = {s: open_file(s) for s in sorted(set(wmap.values()))}
    tensors = merge_shards(wmap, {s: sf.tensors for s, sf in parsed.items()})
    meta: dict[str, str] = {}
    for sf in parsed.values():
        meta.update(sf.metadata)
    return SafetensorsModel(p, tensors, meta, tuple(parsed))


def open_safetensors(path: str | os.PathLike[str]) -> SafetensorsModel:
    """Open a ``.safetensors`` file, an index json, or a directory holding either."""
    p = Path(path)
    if p.is_dir():
        if (p / INDEX_NAME).is_file():
            return open_index(p / INDEX_NAME)
        if (p / "model.safetensors").is_file():
            p = p / "model.safetensors"
        else:
            files = sorted(p.glob("*.safetensors"))
            if len(files) != 1:
                _fail(f"expected {INDEX_NAME} or exactly one .safetensors file, found {len(files)}", str(p))
            p = files[0]
    if p.name.endswith(".json"):
        return open_index(p)
    sf = open_file(p)
    return SafetensorsModel(sf.path, sf.tensors, sf.metadata, (sf.path,))


__all__ = ["INDEX_NAME", "MAX_HEADER_BYTES", "SafetensorsFile", "SafetensorsModel", "merge_shards", "open_file",
           "open_index", "open_safetensors", "parse_header", "read_weight_map"]
