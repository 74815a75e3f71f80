"""Reader of codec 1, the C++ UAII runtime's ``.uaii`` binary (IR 1.0). We read it; we never write it.

Layout after the 16-byte header, all little-endian, ``str`` = u32 length + UTF-8 bytes::

    str name, str producer, str domain
    u32 n_tensors, each: u64 id, str name, u8 dtype, u32 rank, i64 dims[rank], u8 storage_hint, u8 is_weight,
                         str weight_ref
    u32 n_nodes, each:   u64 id, str name, str op_name, str op_version, u32 n + u64 inputs[n],
                         u32 n + u64 outputs[n], u32 n_attr, each: str key, u8 type, value
    u32 n + u64 graph inputs[n], u32 n + u64 graph outputs[n]
    u32 n_meta, each: str key, str value

dtype: 0 unknown, 1 f32, 2 f16, 3 bf16, 4 i8, 5 i32, 6 i64, 7 u8, 8 u32, 9 bool. storage_hint: 0 unspecified,
1 ram, 2 mmap, 3 external. Attribute value by type: 0 str, 1 i64, 2 f64, 3 u8 bool, 4 u32 n + i64[n],
5 u32 n + f64[n].
"""

from __future__ import annotations

from typing import Any

from uaii.ir.graph import Graph
from uaii.ir.serialize._decode import Source, graph_from_doc
from uaii.ir.serialize.reader import ByteReader, Header, Locations

COMPONENT = "uaii codec 1"
CODEC = 1

DTYPE_CODES = {1: "f32", 2: "f16", 3: "bf16", 4: "i8", 5: "i32", 6: "i64", 7: "u8", 8: "u32", 9: "bool"}
STORAGE_NAMES = ("", "ram", "mmap", "external")
ATTR_TYPES = ("string", "int", "float", "bool", "int_array", "float_array")

# Fewest bytes one record can take; counts are checked against them before anything is allocated.
_MIN_TENSOR = 8 + 4 + 1 + 4 + 1 + 1 + 4
_MIN_NODE = 8 + 4 + 4 + 4 + 4 + 4 + 4
_MIN_ATTR = 4 + 1 + 1
_MIN_META = 4 + 4


def read_codec1(data: bytes, header: Header, path: str | None) -> Graph:
    r = ByteReader(data, path=path, component=COMPONENT, pos=16)
    loc = Locations()
    loc.mark((), 16)
    loc.mark(("ir_version",), 8)
    doc: dict[str, Any] = {"ir_version": {"major": header.ir_major, "minor": header.ir_minor}}
    for key in ("name", "producer", "domain"):
        loc.mark((key,), r.pos)
        doc[key] = r.string(f"graph {key}")
    doc["tensors"] = [_tensor(r, loc, i) for i in range(r.count("tensors", _MIN_TENSOR))]
    doc["nodes"] = [_node(r, loc, i) for i in range(r.count("nodes", _MIN_NODE))]
    for key in ("inputs", "outputs"):
        loc.mark((key,), r.pos + 4, 8)
        doc[key] = r.array("Q", f"graph {key}")
    doc["metadata"] = _metadata(r, loc)
    if r.remaining:
        r.fail(f"{r.remaining} trailing bytes after the graph")
    return graph_from_doc(doc, Source(path, COMPONENT, loc.locate))


def _tensor(r: ByteReader, loc: Locations, i: int) -> dict[str, Any]:
    where = ("tensors", i)
    loc.mark(where, r.pos)
    tid = r.u64("tensor id")
    name = r.string("tensor name")
    at = r.pos
    code = r.u8("tensor dtype")
    if code not in DTYPE_CODES:
        r.fail(f"tensor {name!r}: dtype code {code} is not one of codec 1's (1..9)", at)
    loc.mark((*where, "shape"), r.pos + 4, 8)
    dims = r.array("q", f"dims of tensor {name!r}")
    at = r.pos
    hint = r.u8("storage hint")
    if hint >= len(STORAGE_NAMES):
        r.fail(f"tensor {name!r}: storage hint code {hint} is not one of 0..3", at)
    at = r.pos
    is_weight = r.u8("is_weight")
    if is_weight > 1:
        r.fail(f"tensor {name!r}: is_weight byte is {is_weight}, expected 0 or 1", at)
    loc.mark((*where, "weight_ref"), r.pos)
    ref = r.string("weight reference")
    return {"id": tid, "name": name, "dtype": DTYPE_CODES[code], "shape": dims,
            "storage_hint": STORAGE_NAMES[hint], "is_weight": bool(is_weight), "weight_ref": ref}


def _node(r: ByteReader, loc: Locations, i: int) -> dict[str, Any]:
    where = ("nodes", i)
    loc.mark(where, r.pos)
    node: dict[str, Any] = {"id": r.u64("node id")}
    for key in ("name", "op_name", "op_version"):
        loc.mark((*where, key), r.pos)
        node[key] = r.string(f"node {key}")
    for key in ("inputs", "outputs"):
        loc.mark((*where, key), r.pos + 4, 8)
        node[key] = r.array("Q", f"{key} of node {node['name']!r}")
    n_attr = r.count(f"attributes of node {node['name']!r}", _MIN_ATTR)
    node["attributes"] = [_attribute(r, loc, (*where, "attributes", j)) for j in range(n_attr)]
    return node


def _attribute(r: ByteReader, loc: Locations, where: tuple[str | int, ...]) -> dict[str, Any]:
    loc.mark(where, r.pos)
    key = r.string("attribute key")
    at = r.pos
    code = r.u8("attribute type")
    loc.mark((*where, "value"), r.pos)
    value: Any
    if code == 0:
        value = r.string(f"attribute {key!r}")
    elif code == 1:
        value = r.i64(f"attribute {key!r}")
    elif code == 2:
        value = r.f64(f"attribute {key!r}")
    elif code == 3:
        value = r.u8(f"attribute {key!r}")
        if value > 1:
            r.fail(f"bool attribute {key!r} is {value}, expected 0 or 1", r.pos - 1)
        value = bool(value)
    elif code in (4, 5):
        loc.mark((*where, "value"), r.pos + 4, 8)
        value = r.array("q" if code == 4 else "d", f"attribute {key!r}")
    else:
        r.fail(f"attribute {key!r}: type code {code} is not one of 0..5", at)
    return {"key": key, "type": ATTR_TYPES[code], "value": value}


def _metadata(r: ByteReader, loc: Locations) -> dict[str, str]:
    meta: dict[str, str] = {}
    for _ in range(r.count("metadata entries", _MIN_META)):
        at = r.pos
        key = r.string("metadata key")
        loc.mark(("metadata", key), r.pos)
        if key in meta:
            r.fail(f"metadata key {key!r} appears twice", at)
        meta[key] = r.string(f"metadata value of {key!r}")
    return meta
