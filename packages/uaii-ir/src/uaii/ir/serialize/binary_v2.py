"""Codec 2: the ``.uaii`` binary we write, a FlatBuffer with root ``Graph`` (``schemas/uaii_ir.fbs``).

Writing uses the flatc-generated builders under ``uaii.ir._fbs`` in one fixed order, so the same graph
always gives the same bytes: tensors, then nodes, then metadata (sorted by key), then the graph's strings and
vectors.
Empty strings and empty vectors are left out (they read back as empty), except ``Tensor.data``, whose presence
marks an inline constant; ``Attribute.f`` is always written so that ``-0.0`` survives the default-value rule.

Reading goes through :mod:`._flatbuf`, which verifies every offset before it is followed.
"""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

from uaii.ir._fbs import Attribute as fb_attr
from uaii.ir._fbs import Dim as fb_dim
from uaii.ir._fbs import Graph as fb_graph
from uaii.ir._fbs import MetadataEntry as fb_meta
from uaii.ir._fbs import Node as fb_node
from uaii.ir._fbs import Tensor as fb_tensor
from uaii.ir._fbs.AttrType import AttrType as FbAttrType
from uaii.ir._fbs.DType import DType as FbDType
from uaii.ir.dtype import DType
from uaii.ir.graph import AttrType, Graph, StorageHint
from uaii.ir.serialize._decode import Source, graph_from_doc
from uaii.ir.serialize._encode import STORAGE_CODES, graph_to_doc
from uaii.ir.serialize._flatbuf import FlatReader, Record
from uaii.ir.serialize.reader import Header, Locations, pack_header

COMPONENT = "uaii codec 2"
CODEC = 2

DTYPE_CODES: dict[str, int] = {d.value: getattr(FbDType, d.name) for d in DType}
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPE_CODES.items()}
ATTR_CODES: dict[str, int] = {t.value: getattr(FbAttrType, t.name) for t in AttrType}
ATTR_NAMES: dict[int, str] = {code: name for name, code in ATTR_CODES.items()}
STORAGE_NAMES: dict[int, str] = {code: hint.value for hint, code in STORAGE_CODES.items()}


# --- writing ------------------------------------------------------------------------------------------------
def write_codec2(graph: Graph) -> bytes:
    doc = graph_to_doc(graph)
    b = flatbuffers.Builder(1024)
    tensors = [_tensor(b, t) for t in doc["tensors"]]
    nodes = [_node(b, n) for n in doc["nodes"]]
    meta = [_meta_entry(b, k, v) for k, v in sorted(doc["metadata"].items())]
    strings = {key: _string(b, doc[key]) for key in ("name", "producer", "domain")}
    vectors = {"tensors": _tables(b, tensors), "nodes": _tables(b, nodes), "metadata": _tables(b, meta),
               "inputs": _ids(b, doc["inputs"]), "outputs": _ids(b, doc["outputs"])}
    fb_graph.Start(b)
    _add(b, fb_graph.AddName, strings["name"])
    _add(b, fb_graph.AddProducer, strings["producer"])
    _add(b, fb_graph.AddDomain, strings["domain"])
    _add(b, fb_graph.AddTensors, vectors["tensors"])
    _add(b, fb_graph.AddNodes, vectors["nodes"])
    _add(b, fb_graph.AddInputs, vectors["inputs"])
    _add(b, fb_graph.AddOutputs, vectors["outputs"])
    _add(b, fb_graph.AddMetadata, vectors["metadata"])
    b.Finish(fb_graph.End(b))
    major, minor = doc["ir_version"]["major"], doc["ir_version"]["minor"]
    return pack_header(CODEC, major, minor) + bytes(b.Output())


def _add(b: flatbuffers.Builder, adder: Any, offset: int | None) -> None:
    if offset is not None:
        adder(b, offset)


def _string(b: flatbuffers.Builder, s: str) -> int | None:
    return b.CreateString(s) if s else None


def _tables(b: flatbuffers.Builder, offsets: list[int]) -> int | None:
    if not offsets:
        return None
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return int(b.EndVector())


def _numbers(b: flatbuffers.Builder, values: list[Any], dtype: str) -> int | None:
    return int(b.CreateNumpyVector(np.asarray(values, dtype=dtype))) if values else None


def _ids(b: flatbuffers.Builder, ids: list[int]) -> int | None:
    return _numbers(b, ids, "<u8")


def _tensor(b: flatbuffers.Builder, t: dict[str, Any]) -> int:
    name = _string(b, t["name"])
    dims = []
    for d in t["shape"]:
        symbol = _string(b, d) if isinstance(d, str) else None
        fb_dim.Start(b)
        if symbol is not None:
            fb_dim.AddSymbol(b, symbol)
        else:
            fb_dim.AddSize(b, d)
        dims.append(fb_dim.End(b))
    shape = _tables(b, dims)
    ref = _string(b, t["weight_ref"])
    data = b.CreateByteVector(t["data"]) if "data" in t else None
    fb_tensor.Start(b)
    fb_tensor.AddId(b, t["id"])
    _add(b, fb_tensor.AddName, name)
    fb_tensor.AddDtype(b, DTYPE_CODES[t["dtype"]])
    _add(b, fb_tensor.AddShape, shape)
    fb_tensor.AddStorageHint(b, STORAGE_CODES[StorageHint(t["storage_hint"])])
    fb_tensor.AddIsWeight(b, t["is_weight"])
    _add(b, fb_tensor.AddWeightRef, ref)
    _add(b, fb_tensor.AddData, data)
    return int(fb_tensor.End(b))


def _node(b: flatbuffers.Builder, n: dict[str, Any]) -> int:
    attrs = _tables(b, [_attribute(b, a) for a in n["attributes"]])
    strings = {key: _string(b, n[key]) for key in ("name", "op_name", "op_version")}
    inputs, outputs = _ids(b, n["inputs"]), _ids(b, n["outputs"])
    fb_node.Start(b)
    fb_node.AddId(b, n["id"])
    _add(b, fb_node.AddName, strings["name"])
    _add(b, fb_node.AddOpName, strings["op_name"])
    _add(b, fb_node.AddOpVersion, strings["op_version"])
    _add(b, fb_node.AddInputs, inputs)
    _add(b, fb_node.AddOutputs, outputs)
    _add(b, fb_node.AddAttributes, attrs)
    return int(fb_node.End(b))


def _attribute(b: flatbuffers.Builder, a: dict[str, Any]) -> int:
    key, t, v = _string(b, a["key"]), a["type"], a["value"]
    s = _string(b, v) if t == "string" else None
    vec = _numbers(b, v, "<i8" if t == "int_array" else "<f8") if t in ("int_array", "float_array") else None
    fb_attr.Start(b)
    _add(b, fb_attr.AddKey, key)
    fb_attr.AddType(b, ATTR_CODES[t])
    if t == "string":
        _add(b, fb_attr.AddS, s)
    elif t == "int":
        fb_attr.AddI(b, v)
    elif t == "float":
        b.ForceDefaults(True)  # the default 0.0 compares equal to -0.0, which would otherwise be dropped
        fb_attr.AddF(b, v)
        b.ForceDefaults(False)
    elif t == "bool":
        fb_attr.AddB(b, v)
    elif t == "int_array":
        _add(b, fb_attr.AddInts, vec)
    else:
        _add(b, fb_attr.AddFloats, vec)
    return int(fb_attr.End(b))


def _meta_entry(b: flatbuffers.Builder, key: str, value: str) -> int:
    k, v = _string(b, key), _string(b, value)
    fb_meta.Start(b)
    _add(b, fb_meta.AddKey, k)
    _add(b, fb_meta.AddValue, v)
    return int(fb_meta.End(b))


# --- reading ------------------------------------------------------------------------------------------------
def read_codec2(data: bytes, header: Header, path: str | None) -> Graph:
    base = 16
    root = FlatReader(data[base:], base=base, path=path, component=COMPONENT).root()
    loc = Locations()
    loc.mark(("ir_version",), 8)
    src = Source(path, COMPONENT, loc.locate)
    _mark_fields(loc, (), root, base)
    g = root.values
    doc: dict[str, Any] = {
        "ir_version": {"major": header.ir_major, "minor": header.ir_minor},
        "name": g.get("name", ""), "producer": g.get("producer", ""), "domain": g.get("domain", ""),
        "tensors": [_tensor_doc(t, ("tensors", i), loc, src, base)
                    for i, t in enumerate(g.get("tensors", []))],
        "nodes": [_node_doc(n, ("nodes", i), loc, src, base) for i, n in enumerate(g.get("nodes", []))],
        "inputs": g.get("inputs", []), "outputs": g.get("outputs", []),
        "metadata": _meta_doc(g.get("metadata", []), loc, src, base),
    }
    return graph_from_doc(doc, src)


def _mark_fields(loc: Locations, where: tuple[str | int, ...], rec: Record, base: int) -> None:
    loc.mark(where, base + rec.pos)
    for key, pos in rec.at.items():
        loc.mark((*where, key), base + pos, 8 if key in ("inputs", "outputs", "ints", "floats") else 0)


def _code(codes: dict[int, str], rec: Record, key: str, where: tuple[str | int, ...], src: Source) -> str:
    code = rec.values.get(key, 0)
    if code not in codes:
        src.fail((*where, key), f"unknown {key} code {code}")
    return codes[code]


def _tensor_doc(rec: Record, where: tuple[str | int, ...], loc: Locations, src: Source, base: int) -> Any:
    _mark_fields(loc, where, rec, base)
    t = rec.values
    shape: list[int | str] = []
    for j, dim in enumerate(t.get("shape", [])):
        loc.mark((*where, "shape", j), base + dim.pos)
        if "symbol" in dim.values and dim.values.get("size", 0):
            src.fail((*where, "shape", j), "dimension has both a size and a symbol")
        shape.append(dim.values["symbol"] if "symbol" in dim.values else dim.values.get("size", 0))
    doc = {"id": t.get("id", 0), "name": t.get("name", ""),
           "dtype": _code(DTYPE_NAMES, rec, "dtype", where, src), "shape": shape,
           "storage_hint": _code(STORAGE_NAMES, rec, "storage_hint", where, src),
           "is_weight": bool(t.get("is_weight", 0)), "weight_ref": t.get("weight_ref", "")}
    if "data" in t:
        doc["data"] = t["data"]
    return doc


def _node_doc(rec: Record, where: tuple[str | int, ...], loc: Locations, src: Source, base: int) -> Any:
    _mark_fields(loc, where, rec, base)
    n = rec.values
    attrs = []
    for j, a in enumerate(n.get("attributes", [])):
        aw = (*where, "attributes", j)
        _mark_fields(loc, aw, a, base)
        t = _code(ATTR_NAMES, a, "type", aw, src)
        field, default = {"string": ("s", ""), "int": ("i", 0), "float": ("f", 0.0), "bool": ("b", 0),
                          "int_array": ("ints", []), "float_array": ("floats", [])}[t]
        value = a.values.get(field, default)
        loc.mark((*aw, "value"), base + a.at.get(field, a.pos), 8 if t.endswith("_array") else 0)
        attrs.append({"key": a.values.get("key", ""), "type": t,
                      "value": bool(value) if t == "bool" else value})
    return {"id": n.get("id", 0), "name": n.get("name", ""), "op_name": n.get("op_name", ""),
            "op_version": n.get("op_version", ""), "inputs": n.get("inputs", []),
            "outputs": n.get("outputs", []), "attributes": attrs}


def _meta_doc(entries: list[Record], loc: Locations, src: Source, base: int) -> dict[str, str]:
    meta: dict[str, str] = {}
    for e in entries:
        key = e.values.get("key", "")
        loc.mark(("metadata", key), base + e.pos)
        if key in meta:
            src.fail(("metadata", key), f"metadata key {key!r} appears twice")
        meta[key] = e.values.get("value", "")
    return meta
