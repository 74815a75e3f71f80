"""``open_onnx``: an ONNX model as a small graph plus the exact byte location of every initializer.

The file is read through mmap by :mod:`.proto`'s walker, which finds every initializer's data and hands ``onnx``
a copy of the model with that data stripped, so memory follows the graph, never the weights, and models over
protobuf's 2 GiB limit open too. Then each initializer becomes

- a :class:`~uaii.loaders.index.TensorInfo` (file, offset, nbytes) when its bytes can be read in place: its
  ``raw_data`` inside the ``.onnx`` itself, or its external data (sandboxed by :mod:`.external`);
- a materialized array in ``inline`` when its values sit in typed fields (``float_data``, ``int64_data``...),
  when it is under 64 bytes, or when UAII has no element type for it (uint16, uint64: up to 16 MiB).

Tensors of Constant nodes stay in the model (the importer folds them); those saved as external data are read
into it here (sandboxed, up to 64 MiB each), so nothing downstream ever follows a path a file names.
Every corrupt input raises :class:`~uaii.ir.FormatError` naming the file, the byte offset and what was expected.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import numpy as np

from uaii.ir import FormatError

from ..errors import LoaderError, require
from ..index import TensorInfo
from .dtypes import OnnxType, decode_raw, decode_typed, elements, onnx_type, stored_nbytes, stored_shape, unpack
from .external import Sandbox, read_exact
from .proto import TYPED_FIELDS, Layout, SparseRecord, TensorRecord, WorkCounter, walk_model

INLINE_BELOW = 64
"""Initializers smaller than this are materialized: a reference would cost more than the bytes."""
MAX_UNTYPED_INLINE = 1 << 24
"""uint16 / uint64 initializers (no UAII element type, so never weights) are materialized up to this size."""
MAX_CONSTANT_EXTERNAL = 1 << 26
"""A Constant node's tensor saved as external data is read into the model up to this size."""
MAX_SPARSE_DENSE = 1 << 20
"""Sparse initializers are densified up to this many bytes; larger ones are refused."""
MAX_ELEMENTS = 1 << 56
"""Elements a shape may span (zero dims counted as 1): beyond it numpy cannot even make an empty array."""


@dataclass(frozen=True)
class OnnxFile:
    """A parsed ONNX model: the stripped graph, and where each initializer's values are.

    Every initializer (those of nested graphs too) is in exactly one of ``weights`` and ``inline``, and in
    ``onnx_types`` (its ``TensorProto.DataType``) and ``shapes`` (its logical shape, numpy order). int4/uint4
    initializers are packed bytes in both (``u8`` of shape ``[nbytes]``); :meth:`value` unpacks them.
    """

    path: Path
    model: Any  # onnx.ModelProto, initializers without data
    opsets: Mapping[str, int]
    weights: Mapping[str, TensorInfo]
    inline: Mapping[str, np.ndarray]
    onnx_types: Mapping[str, int] = field(default_factory=dict)
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def value(self, name: str, limit: int = 1 << 20) -> np.ndarray:
        """The values of initializer ``name`` (read-only), read through its file when it is a weight.

        For constants the importer folds; refuses (FormatError) above ``limit`` bytes of storage.
        """
        code = self.onnx_types.get(name)
        t = onnx_type(code) if code is not None else None
        if t is None:
            raise LoaderError(f"{self.path}: the model has no initializer named {name!r}")
        shape = self.shapes[name]
        stored = self.inline.get(name)
        if stored is None:
            info = self.weights[name]
            self._check_limit(name, info.nbytes, limit)
            try:
                data = read_exact(info.file, info.offset, info.nbytes)
            except OSError as exc:
                raise FormatError(f"cannot read initializer {name!r}: {exc.strerror or exc}", path=info.file,
                                  offset=info.offset, component="onnx") from None
            if len(data) != info.nbytes:
                raise FormatError(f"initializer {name!r}: the file ended after {len(data)} of its {info.nbytes} "
                                  "bytes (did it change since it was opened?)", path=info.file, offset=info.offset,
                                  component="onnx")
            try:
                stored = decode_raw(t, data, shape)
            except ValueError as exc:
                raise FormatError(f"initializer {name!r}: {exc}", path=info.file, offset=info.offset,
                                  component="onnx") from None
        else:
            self._check_limit(name, stored.nbytes, limit)
        out = unpack(t, stored, shape)
        out.flags.writeable = False
        return out

    def _check_limit(self, name: str, nbytes: int, limit: int) -> None:
        if nbytes > limit:
            raise FormatError(f"initializer {name!r} is {nbytes} bytes; values read at load time are limited to "
                              f"{limit} bytes", path=str(self.path), component="onnx")


def open_onnx(path: str | os.PathLike[str], *, work: WorkCounter | None = None) -> OnnxFile:
    """Open an ONNX model without loading its weights. ``work`` counts deterministic work units (tests)."""
    onnx = require("onnx", "onnx", "reading ONNX models")
    try:
        real = Path(os.path.realpath(os.fspath(path)))
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FormatError(f"cannot read: {reason}", path=os.fsdecode(path), component="onnx") from None
    where = str(real)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError("not a regular file", path=where, component="onnx")
        if st.st_size == 0:
            raise FormatError("empty file; expected an ONNX ModelProto", path=where, offset=0, component="onnx")
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    sandbox = Sandbox(where)
    with mm:
        layout = walk_model(mm, st.st_size, where, onnx.ModelProto.DESCRIPTOR, work)
        tensors = _Tensors(mm, where, sandbox, work)
        tensors.add_all(layout)
    model = _parse(onnx, layout, where, work)
    if layout.external_attributes:
        _read_external_constants(model, sandbox)
    return OnnxFile(real, model, MappingProxyType(_opsets(model, where)), MappingProxyType(tensors.weights),
                    MappingProxyType(tensors.inline), MappingProxyType(tensors.types),
                    MappingProxyType(tensors.shapes))


def _parse(onnx: Any, layout: Layout, where: str, work: WorkCounter | None) -> Any:
    if work is not None:
        work.tick(len(layout.stripped) // 4096 + 1)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(layout.stripped)
    except Exception as exc:  # protobuf's DecodeError (we do not import protobuf itself)
        raise FormatError(f"onnx cannot parse the model ({type(exc).__name__}: {exc})", path=where,
                          component="onnx") from None
    if model.ir_version < 1 or not model.HasField("graph"):
        raise FormatError("expected an ONNX ModelProto with an ir_version and a graph; found "
                          f"ir_version {model.ir_version} and {'a' if model.HasField('graph') else 'no'} graph",
                          path=where, component="onnx")
    return model


def _opsets(model: Any, where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in model.opset_import:
        domain = "" if o.domain in ("", "ai.onnx") else o.domain
        if o.version < 1:
            raise FormatError(f"opset_import gives domain {o.domain or 'ai.onnx'!r} version {o.version}; "
                              "versions start at 1", path=where, component="onnx")
        if out.get(domain, o.version) != o.version:
            raise FormatError(f"opset_import gives domain {o.domain or 'ai.onnx'!r} twice, as versions "
                              f"{out[domain]} and {o.version}", path=where, component="onnx")
        out[domain] = o.version
    return out


class _Tensors:
    """Turns walker records into weights (references) and inline arrays, checking each against its bytes."""

    def __init__(self, buf: Any, path: str, sandbox: Sandbox, work: WorkCounter | None) -> None:
        self.buf, self.path, self.sandbox, self.work = buf, path, sandbox, work
        self.weights: dict[str, TensorInfo] = {}
        self.inline: dict[str, np.ndarray] = {}
        self.types: dict[str, int] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}

    def fail(self, rec: TensorRecord, message: str, offset: int | None = None) -> NoReturn:
        raise FormatError(f"initializer {rec.name!r}: {message}", path=self.path,
                          offset=rec.offset if offset is None else offset, component="onnx")

    def tick(self, nbytes: int = 0) -> None:
        if self.work is not None:
            self.work.tick(1 + nbytes // 4096)

    def add_all(self, layout: Layout) -> None:
        for rec in layout.initializers:
            t, data = self.resolve(rec, materialize=False)
            self.put(rec.name, rec.offset, t, tuple(rec.dims), data)
        for sparse in layout.sparse:
            self.densify(sparse)

    def put(self, name: str, offset: int, t: OnnxType, shape: tuple[int, ...], data: TensorInfo | np.ndarray) -> None:
        if name in self.types:
            raise FormatError(f"two initializers are named {name!r}", path=self.path, offset=offset,
                              component="onnx")
        self.types[name] = t.code
        self.shapes[name] = shape
        if isinstance(data, TensorInfo):
            self.weights[name] = data
        else:
            data.flags.writeable = False
            self.inline[name] = data

    def resolve(self, rec: TensorRecord, *, materialize: bool,
                limit: int = MAX_UNTYPED_INLINE) -> tuple[OnnxType, TensorInfo | np.ndarray]:
        """The element type of ``rec`` and its bytes: a reference in a file, or (small, typed) an array."""
        self.tick()
        t = onnx_type(rec.data_type)
        if t is None:
            self.fail(rec, f"data_type {rec.data_type} is not an ONNX element type")
        if not t.supported:
            self.fail(rec, f"element type {t.name}: {t.refused}")
        if rec.segment:
            self.fail(rec, "segmented tensors (TensorProto.segment) are not supported")
        if rec.strings:
            self.fail(rec, f"string_data is set on a {t.name} tensor")
        if elements(max(d, 1) for d in rec.dims) >= MAX_ELEMENTS:
            self.fail(rec, f"shape {rec.dims} is too large for any tensor (numpy refuses it even when empty)")
        n = elements(rec.dims)
        nbytes = stored_nbytes(t, n)
        need = f"a {t.name} tensor of shape {rec.dims}"
        dtype = t.dtype
        small = materialize or nbytes < INLINE_BELOW or dtype is None
        if small and nbytes > limit:
            self.fail(rec, f"{need} is {nbytes} bytes; UAII reads it whole only up to {limit} bytes"
                      + ("" if t.dtype is not None else f" (it has no UAII element type for {t.name})"))
        if rec.location == 1:
            if rec.raw is not None or rec.typed:
                self.fail(rec, "data_location is EXTERNAL but the tensor also holds data in the file")
            label = f"initializer {rec.name!r}"
            span = self.sandbox.span(label, rec.external, nbytes, need, rec.offset)
            if dtype is not None and not small:
                return t, TensorInfo(rec.name, dtype, stored_shape(t, rec.dims, nbytes), span.file, span.offset,
                                     nbytes)
            self.tick(nbytes)
            return t, self.decode(rec, lambda: decode_raw(t, self.sandbox.read(label, span, rec.offset),
                                                             rec.dims))
        if rec.external:
            self.fail(rec, "it has external_data entries but its data_location is not EXTERNAL")
        if rec.raw is not None:
            start, end = rec.raw
            if rec.typed:
                self.fail(rec, f"it holds both raw_data and {TYPED_FIELDS[rec.typed[0][0]]}")
            if end - start != nbytes:
                self.fail(rec, f"raw_data is {end - start} bytes; {need} needs {nbytes}", start)
            if dtype is not None and not small:
                return t, TensorInfo(rec.name, dtype, stored_shape(t, rec.dims, nbytes), self.path, start, nbytes)
            return t, self.decode(rec, lambda: decode_raw(t, self.buf[start:end], rec.dims), start)
        if rec.typed:
            return t, self.typed(rec, t, need)
        if n:
            self.fail(rec, f"{need} holds no data (no raw_data, no typed values, no external data)")
        return t, np.zeros(stored_shape(t, rec.dims, 0), dtype=np.dtype(t.numpy))

    def typed(self, rec: TensorRecord, t: OnnxType, need: str) -> np.ndarray:
        numbers = {number for number, _, _ in rec.typed}
        if len(numbers) > 1:
            self.fail(rec, "its values are spread over " + " and ".join(TYPED_FIELDS[f] for f in sorted(numbers)))
        number = numbers.pop()
        size = sum(end - start for _, start, end in rec.typed)
        expect = max(stored_nbytes(t, elements(rec.dims)), elements(rec.dims)) * 10 + 16
        if size > expect:  # each value takes at most 10 bytes: a longer field lies before we decode it
            self.fail(rec, f"{TYPED_FIELDS[number]} is {size} bytes, more than {need} can take", rec.typed[0][1])
        self.tick(size)
        data = b"".join(self.buf[start:end] for _, start, end in rec.typed)
        return self.decode(rec, lambda: decode_typed(t, number, data, rec.dims), rec.typed[0][1])

    def decode(self, rec: TensorRecord, fn: Callable[[], np.ndarray], offset: int | None = None) -> np.ndarray:
        """``fn()``, whose ValueError (values that lie about their type) becomes this tensor's FormatError."""
        try:
            return fn()
        except ValueError as exc:
            self.fail(rec, str(exc), offset)

    def densify(self, sparse: SparseRecord) -> None:
        """A small sparse initializer as a dense inline array (ONNX's linear or [NNZ, rank] indices)."""
        values, indices = sparse.values, sparse.indices
        if values is None or indices is None:
            raise FormatError("a sparse initializer lacks its values or its indices", path=self.path,
                              offset=sparse.offset, component="onnx")
        dims = tuple(sparse.dims)
        t, vals = self.resolve(values, materialize=True, limit=MAX_SPARSE_DENSE)
        if t.packed or any(d < 0 for d in dims) or elements(max(d, 1) for d in dims) >= MAX_ELEMENTS:
            self.fail(values, f"sparse {t.name} initializers with dims {list(dims)} are not supported")
        dense = elements(dims) * np.dtype(t.numpy).itemsize
        if dense > MAX_SPARSE_DENSE:
            self.fail(values, f"sparse initializers are not supported (this one is {dense} bytes dense; only "
                      f"those up to {MAX_SPARSE_DENSE} bytes are densified)")
        ti, idx = self.resolve(indices, materialize=True, limit=MAX_SPARSE_DENSE)
        assert isinstance(vals, np.ndarray) and isinstance(idx, np.ndarray)
        nnz = vals.size
        if ti.code != 7 or vals.ndim != 1 or idx.shape not in ((nnz,), (nnz, len(dims))):
            self.fail(values, f"a sparse initializer needs values of shape [NNZ] and int64 indices of shape [NNZ] "
                      f"or [NNZ, {len(dims)}]; found values {list(vals.shape)} and {ti.name} indices "
                      f"{list(idx.shape)}")
        if idx.ndim == 2:
            if nnz and ((idx < 0).any() or (idx >= np.array(dims, dtype=np.int64)).any()):
                self.fail(values, "a sparse index lies outside the dense shape")
            linear = np.ravel_multi_index(tuple(idx.T), dims) if nnz else idx.reshape(0)
        else:
            linear = idx
        if nnz and (int(linear.min()) < 0 or int(linear.max()) >= elements(dims)
                    or (np.diff(linear) <= 0).any()):
            self.fail(values, "sparse indices must be in range and strictly increasing")
        out = np.zeros(elements(dims), dtype=vals.dtype)
        out[linear] = vals
        self.put(values.name, sparse.offset, t, dims, out.reshape(dims))


def _read_external_constants(model: Any, sandbox: Sandbox) -> None:
    """Constant (and other attribute) tensors saved as external data are read into the model, sandboxed."""
    for label, tensor in _attribute_tensors(model, sandbox):
        if tensor.data_location != 1:
            continue
        t = onnx_type(tensor.data_type)
        if t is None or not t.supported:
            sandbox.fail(label, None, f"element type {tensor.data_type} of external data is not supported", None)
        dims = list(tensor.dims)
        nbytes = stored_nbytes(t, elements(dims))
        if nbytes > MAX_CONSTANT_EXTERNAL:
            sandbox.fail(label, None, f"its external data is {nbytes} bytes; tensors in node attributes are read "
                         f"into memory only up to {MAX_CONSTANT_EXTERNAL} bytes", None)
        entries = [(e.key, e.value, None) for e in tensor.external_data]
        span = sandbox.span(label, entries, nbytes, f"a {t.name} tensor of shape {dims}", None)
        tensor.raw_data = sandbox.read(label, span, None)
        tensor.ClearField("external_data")
        tensor.data_location = 0


def _attribute_tensors(model: Any, sandbox: Sandbox) -> Iterator[tuple[str, Any]]:
    """Every tensor held by a node attribute, in every graph (subgraphs too) and every model function."""
    lists: list[tuple[str, Any]] = [(f"function {f.name!r}", f.node) for f in model.functions]
    graphs = [model.graph]
    while graphs or lists:
        if not lists:
            g = graphs.pop()
            lists.append((f"graph {g.name!r}", g.node))
            continue
        where, nodes = lists.pop()
        for node in nodes:
            yield from _node_tensors(where, node, graphs, sandbox)


def _node_tensors(where: str, node: Any, graphs: list[Any], sandbox: Sandbox) -> Iterator[tuple[str, Any]]:
    """The tensors of one node's attributes; its subgraphs go onto ``graphs``."""
    for a in node.attribute:
        label = f"attribute {a.name!r} of node {node.name!r} ({node.op_type}) in {where}"
        if a.HasField("t"):
            yield label, a.t
        yield from ((label, t) for t in a.tensors)
        if a.HasField("g"):
            graphs.append(a.g)
        graphs.extend(a.graphs)
        sparse = [a.sparse_tensor] if a.HasField("sparse_tensor") else []
        for s in [*sparse, *a.sparse_tensors]:
            if s.values.data_location == 1 or s.indices.data_location == 1:
                sandbox.fail(label, None, "sparse tensors with external data are not supported", None)


__all__ = ["INLINE_BELOW", "MAX_CONSTANT_EXTERNAL", "MAX_SPARSE_DENSE", "MAX_UNTYPED_INLINE", "OnnxFile",
           "open_onnx"]
