"""PyTorch checkpoints without torch: ``torch.save`` zip archives, the legacy (pre-1.6) format and sharded
``pytorch_model-0000x-of-0000N.bin`` with ``pytorch_model.bin.index.json``.

The pickles are read by :mod:`.torch_pickle` (nothing is imported or called); the tensors' bytes stay where they are
in the file: a zip archive stores each storage uncompressed (``archive/data/<key>``, torch aligns it), the legacy
format writes the storages raw after its pickles, so each tensor is a :class:`~.index.TensorInfo` (file, absolute
offset, byte count) that the storage layer maps or reads in place, as for safetensors. Every tensor is checked
against its storage before it is indexed: dtype, offset + extent within the storage's real size, contiguous strides
(views with gaps or transposes cannot be read in place and are refused by name). Tensors sharing a storage (tied
weights) share bytes. A training checkpoint whose ``state_dict`` / ``model`` / ``module`` entry holds the weights
gives that entry (the rest is named in :attr:`TorchCheckpoint.skipped`); a TorchScript archive is refused with what
it is.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from uaii.ir import FormatError

from .index import TensorInfo
from .safetensors import merge_shards, read_weight_map
from .torch_pickle import STORAGE_TYPES, CheckpointDict, StorageTag, TensorRecord, load, load_prefix

INDEX_NAME = "pytorch_model.bin.index.json"
MAX_PICKLE_BYTES = 1 << 30
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_WRAPPERS = ("state_dict", "model", "module", "model_state_dict")


# what zipfile raises for a damaged or unusual archive (an unsupported version or method: NotImplementedError; an
# encrypted member: RuntimeError)
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, NotImplementedError, RuntimeError,
               EOFError, struct.error, zlib.error)


def _fail(message: str, path: str, offset: int | None = None) -> NoReturn:
    raise FormatError(message, path=path, offset=offset, component="torch")


@dataclass(frozen=True)
class _Storage:
    """Where a storage's bytes are: ``offset`` in ``path``, ``numel`` elements of ``tag``'s dtype."""

    key: str
    tag: str
    offset: int
    numel: int


@dataclass
class TorchCheckpoint:
    """The tensors of one checkpoint file or of a sharded set (``path``: the file or the index json)."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    files: tuple[Path, ...]
    skipped: list[str] = field(default_factory=list)  # entries of a training checkpoint that are not weights


def _tensor(name: str, rec: TensorRecord, path: str) -> TensorInfo:
    st = rec.storage
    if not isinstance(st, _Storage):
        _fail(f"tensor {name!r} is not built on a storage of this file", path, rec.where)
    dtype, size = STORAGE_TYPES[st.tag]
    numel = 1
    for d in rec.shape:
        numel *= d
    expect, acc = [], 1
    for d in reversed(rec.shape):
        expect.append(acc)
        acc *= d
    expect.reverse()
    if any(d != 1 and s != e for d, s, e in zip(rec.shape, rec.stride, expect, strict=True)):
        _fail(f"tensor {name!r} is a strided view (shape {list(rec.shape)}, stride {list(rec.stride)}) of its "
              "storage; only contiguous tensors are read in place (re-save it with .contiguous())", path, rec.where)
    if rec.offset + numel > st.numel:
        _fail(f"tensor {name!r} spans elements {rec.offset}..{rec.offset + numel} of storage {st.key!r}, which "
              f"holds {st.numel}", path, rec.where)
    return TensorInfo(name, dtype, rec.shape, path, st.offset + rec.offset * size, numel * size)


def _state_dict(obj: Any, path: str, skipped: list[str]) -> dict[str, TensorRecord]:
    """The name -> tensor map of the checkpoint object: a state dict, or one held by a training checkpoint."""
    if isinstance(obj, dict) and not any(isinstance(v, TensorRecord) for v in obj.values()):
        for key in _WRAPPERS:
            inner = obj.get(key)
            if isinstance(inner, dict) and any(isinstance(v, TensorRecord) for v in inner.values()):
                skipped.extend(sorted(str(k) for k in obj if k != key))
                obj = inner
                break
    if not isinstance(obj, dict):
        _fail(f"the checkpoint holds a {type(obj).__name__}, not a state dict of tensors", path)
    out: dict[str, TensorRecord] = {}
    for k, v in obj.items():
        if isinstance(v, TensorRecord) and isinstance(k, str):
            out[k] = v
        else:
            skipped.append(str(k))
    if not out:
        _fail("the checkpoint holds no tensors", path)
    return out


def _pid_parts(pid: Any, path: str, at: int) -> tuple[str, str, int, Any]:
    if not isinstance(pid, tuple) or len(pid) not in (5, 6) or pid[0] != "storage":
        _fail(f"a persistent id {pid!r:.80} is not a storage reference", path, at)
    tag, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(tag, StorageTag):
        _fail(f"a storage's type is {tag!r:.60}, not one of torch's storage types", path, at)
    if not isinstance(key, str) or not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        _fail(f"a storage reference has key {key!r:.40} and size {numel!r:.40}", path, at)
    return tag.name, key, numel, pid[5] if len(pid) == 6 else None


def _read_small(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str, limit: int, p: str) -> bytes:
    """A member read whole (CRC checked) only when it is stored uncompressed and both its sizes are at most
    ``limit``: zipfile sizes its reads by the directory's compressed size, so a lying one would allocate that much
    (a fuzzed archive made one read ask for 1 GiB). Nothing is decompressed: no zip bomb, no codec's errors."""
    if info.compress_type != zipfile.ZIP_STORED:
        _fail(f"{what} is compressed; torch.save stores every member uncompressed", p, info.header_offset)
    if info.file_size > limit or info.compress_size != info.file_size:
        _fail(f"{what} is {info.file_size} bytes, stored in {info.compress_size} (limit {limit}, stored as is)", p,
              info.header_offset)
    try:
        return zf.read(info)
    except _ZIP_ERRORS as exc:
        _fail(f"cannot read {what}: {exc}", p, info.header_offset)


def _open_zip(p: str, size: int) -> Any:
    try:
        zf = zipfile.ZipFile(p)
    except _ZIP_ERRORS as exc:
        _fail(f"not a readable zip archive: {exc}", p)
    with zf:
        names = zf.namelist()
        pkls = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if any(n.endswith("/constants.pkl") for n in names) or any("/code/" in n for n in names):
            _fail("a TorchScript archive (torch.jit.save): it holds a program, not a state dict; load it in torch "
                  "and save its state_dict() instead", p)
        if len(pkls) != 1 or len([n for n in names if n.endswith("data.pkl")]) != 1:
            _fail(f"a torch.save archive holds one <name>/data.pkl; found {len(pkls)} at the top level and "
                  f"{len([n for n in names if n.endswith('data.pkl')])} in all", p)
        prefix = pkls[0][:-len("data.pkl")]
        if len(names) != len(set(names)):
            _fail("the archive names a member twice", p)
        raw = _read_small(zf, zf.getinfo(pkls[0]), "data.pkl", MAX_PICKLE_BYTES, p)
        members = {n: zf.getinfo(n) for n in names}
        order = members.get(f"{prefix}byteorder")
        if order is not None:  # absent in archives of torch < 1.10, which wrote little-endian only
            value = _read_small(zf, order, "byteorder", 16, p)
            if value != b"little":
                _fail(f"the archive's byteorder is {value!r}; only little-endian checkpoints are read (the tensors "
                      "would be byte-swapped)", p, order.header_offset)
    storages: dict[str, _Storage] = {}

    def storage(pid: Any, at: int) -> _Storage:
        tag, key, numel, _view = _pid_parts(pid, p, at)
        member = members.get(f"{prefix}data/{key}")
        if member is None:
            _fail(f"storage {key!r} has no member {prefix}data/{key} in the archive", p, at)
        if member.compress_type != zipfile.ZIP_STORED:
            _fail(f"storage {key!r} is compressed; torch.save stores storages uncompressed so they can be mapped",
                  p, member.header_offset)
        nbytes = numel * STORAGE_TYPES[tag][1]
        if member.file_size != nbytes:
            _fail(f"storage {key!r} claims {numel} elements of {tag} ({nbytes} bytes); its member holds "
                  f"{member.file_size}", p, member.header_offset)
        with open(p, "rb") as f:
            f.seek(member.header_offset)
            head = f.read(30)
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            _fail(f"storage {key!r}: no local file header at its offset", p, member.header_offset)
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = member.header_offset + 30 + name_len + extra_len
        if start + nbytes > size:
            _fail(f"storage {key!r} runs past the end of the file", p, start)
        old = storages.get(key)
        if old is not None and old.tag != tag:
            _fail(f"storage {key!r} is referenced as {old.tag} and as {tag}", p, at)
        storages[key] = _Storage(key, tag, start, numel)
        return storages[key]

    return load(raw, p, 0, storage)


def _legacy(p: str, data: Any) -> Any:
    """The pre-zip format: magic, protocol and system-info pickles, the main pickle, the storage keys, then each
    storage raw (8-byte element count, then its bytes) in the keys' order."""
    storages: dict[str, _Storage] = {}
    pending: dict[str, tuple[str, int]] = {}  # key -> (tag, numel) as the main pickle references it

    def reference(pid: Any, at: int) -> Any:
        tag, key, numel, view = _pid_parts(pid, p, at)
        if view is not None:
            _fail(f"storage {key!r} is referenced as a view of another storage (torch < 0.4 checkpoints); "
                  "re-save it with a current torch", p, at)
        old = pending.get(key)
        if old is not None and old != (tag, numel):
            _fail(f"storage {key!r} is referenced with two types or sizes", p, at)
        pending[key] = (tag, numel)
        return _Lazy(key)

    offset = 0

    def next_pickle(persistent: Any = None) -> Any:
        nonlocal offset
        obj, used = load_prefix(memoryview(data)[offset:], p, offset, persistent)
        offset += used
        return obj

    if next_pickle() != LEGACY_MAGIC:
        _fail("not a PyTorch checkpoint (no zip archive, no legacy magic number)", p, 0)
    proto = next_pickle()
    if proto != 1001:
        _fail(f"legacy checkpoint protocol {proto!r:.20}; only 1001 exists", p)
    info = next_pickle()  # system info: endianness and type sizes (a dict of plain values)
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        _fail("the legacy checkpoint is not marked little-endian (sys_info.little_endian); only little-endian "
              "checkpoints are read", p)
    obj = next_pickle(reference)
    keys = next_pickle()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or set(keys) != set(pending) \
            or len(set(keys)) != len(keys):
        _fail("the legacy checkpoint's storage key list does not match the storages its tensors use", p, offset)
    for key in keys:
        if offset + 8 > len(data):
            _fail(f"storage {key!r}: the file ends before its size", p, offset)
        (numel,) = struct.unpack_from("<q", data, offset)
        tag, want = pending[key]
        if numel != want:
            _fail(f"storage {key!r} holds {numel} elements; its tensors' reference says {want}", p, offset)
        start = offset + 8
        offset = start + numel * STORAGE_TYPES[tag][1]
        if offset > len(data):
            _fail(f"storage {key!r} runs past the end of the file", p, start)
        storages[key] = _Storage(key, tag, start, numel)
    return _resolve(obj, storages)


@dataclass(frozen=True)
class _Lazy:
    key: str  # a legacy storage, placed once its bytes are found after the pickles


def _resolve(obj: Any, storages: dict[str, _Storage]) -> Any:
    """The legacy object with its storage references placed (state dicts are flat: one level, or two for a
    training checkpoint)."""
    def fix(v: Any) -> Any:
        if isinstance(v, TensorRecord) and isinstance(v.storage, _Lazy):
            return TensorRecord(storages[v.storage.key], v.offset, v.shape, v.stride, v.where)
        return v
    if isinstance(obj, dict):
        out = CheckpointDict()
        for k, v in obj.items():
            if isinstance(v, dict):
                inner = CheckpointDict()
                inner.update({k2: fix(v2) for k2, v2 in v.items()})
                v = inner
            out[k] = fix(v)
        return out
    return obj


def open_checkpoint(path: str | os.PathLike[str]) -> TorchCheckpoint:
    """One ``torch.save`` file (zip or legacy)."""
    p = str(Path(path).resolve())
    try:
        size = os.path.getsize(p)
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise FormatError(f"cannot read: {exc.strerror or exc}", path=p, component="torch") from None
    if magic[:2] == b"PK":
        obj = _open_zip(p, size)
    elif size == 0:
        _fail("the file is empty", p, 0)
    else:  # mapped, not read: only the pickles and the storages' 8-byte headers are touched
        with open(p, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            obj = _legacy(p, mm)
        finally:
            with contextlib.suppress(BufferError):  # a traceback may still hold a view of it: then GC closes it
                mm.close()
    skipped: list[str] = []
    records = _state_dict(obj, p, skipped)
    tensors = {name: _tensor(name, rec, p) for name, rec in records.items()}
    return TorchCheckpoint(Path(p), tensors, {}, (Path(p),), skipped)


def open_torch_index(path: str | os.PathLike[str]) -> TorchCheckpoint:
    """A sharded checkpoint: the index json's ``weight_map`` and every shard it names (the index rules of sharded
    safetensors: :func:`.safetensors.read_weight_map`, :func:`.safetensors.merge_shards`)."""
    p = Path(path).resolve()
    wmap = read_weight_map(p, "torch")
    parsed = {s: open_checkpoint(s) for s in sorted(set(wmap.values()))}
    tensors = merge_shards(wmap, {s: ck.tensors for s, ck in parsed.items()}, "torch")
    skipped = [name for ck in parsed.values() for name in ck.skipped]
    return TorchCheckpoint(p, tensors, {}, tuple(ck.path for ck in parsed.values()), skipped)


def open_torch(path: str | os.PathLike[str]) -> TorchCheckpoint:
    """A checkpoint file, an index json, or a directory holding ``pytorch_model.bin`` or the index."""
    p = Path(path)
    if p.is_dir():
        if (p / INDEX_NAME).is_file():
            return open_torch_index(p / INDEX_NAME)
        return open_checkpoint(p / "pytorch_model.bin")
    if p.name.endswith(".json"):
        return open_torch_index(p)
    return open_checkpoint(p)


__all__ = ["INDEX_NAME", "TorchCheckpoint", "open_checkpoint", "open_torch", "open_torch_index"]
