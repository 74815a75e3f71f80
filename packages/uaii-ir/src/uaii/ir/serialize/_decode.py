"""Document → Graph: the one place where every reader's schema checks live.

The JSON reader hands over what ``json.loads`` produced; the binary readers build the same document from their
records. Every value is type- and range-checked here, ids are mapped to names, and any failure becomes a
:class:`FormatError` that names the document path (``$.nodes[3].inputs[1]``) and, through the source's
``locate`` callback, the byte offset of that value in the file.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any, NoReturn

from uaii.ir.dtype import DType
from uaii.ir.errors import FormatError, UaiiError
from uaii.ir.graph import IR_VERSION, Attribute, AttrType, Graph, Node, StorageHint, Tensor
from uaii.ir.serialize._encode import I64_LIMIT, U32_LIMIT
from uaii.ir.serialize._floats import parse_float_text
from uaii.ir.weightref import WeightRef

Where = tuple[str | int, ...]
U64_LIMIT = 1 << 64

_STORAGE = {"": StorageHint.UNSPECIFIED, "unspecified": StorageHint.UNSPECIFIED, "ram": StorageHint.RAM,
            "mmap": StorageHint.MMAP, "external": StorageHint.EXTERNAL}
_OP_VERSION = re.compile(r"[0-9]{1,18}")
_PREFIX = re.compile(r"^\[[^\]]*\] ")

# key → required?
_TOP_KEYS = {"ir_version": True, "name": True, "producer": True, "domain": True, "tensors": True,
             "nodes": True, "inputs": True, "outputs": True, "metadata": False}
_TENSOR_KEYS = {"id": True, "name": True, "dtype": True, "shape": True, "storage_hint": False,
                "is_weight": False, "weight_ref": False, "quant_format": False, "data": False}
_NODE_KEYS = {"id": True, "name": True, "op_name": True, "op_version": True, "inputs": True, "outputs": True,
              "attributes": False}
_ATTR_KEYS = {"key": True, "type": True, "value": True}
_VERSION_KEYS = {"major": True, "minor": True}


class DuplicateKeys(dict[str, Any]):
    """What the JSON reader builds for an object that repeats a key; rejected when the decoder meets it."""

    def __init__(self, pairs: list[tuple[str, Any]], duplicate: str) -> None:
        super().__init__(pairs)
        self.duplicate = duplicate


def json_path(where: Where) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where)


class Source:
    """Where a document came from: file path, component tag, and a map from document path to byte offset."""

    def __init__(self, path: str | None, component: str, locate: Callable[[Where], int | None]) -> None:
        self.path = path
        self.component = component
        self.locate = locate

    def fail(self, where: Where, message: str) -> NoReturn:
        raise FormatError(f"{json_path(where)}: {message}", path=self.path, offset=self.locate(where),
                          component=self.component)


# --- typed accessors ----------------------------------------------------------------------------------------
def _kind(v: Any) -> str:
    return {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "an array",
            type(None): "null"}.get(type(v), "an object" if isinstance(v, dict) else type(v).__name__)


def _obj(v: Any, where: Where, src: Source, keys: dict[str, bool]) -> dict[str, Any]:
    if not isinstance(v, dict):
        src.fail(where, f"expected an object, found {_kind(v)}")
    if isinstance(v, DuplicateKeys):
        src.fail((*where, v.duplicate), f"key {v.duplicate[:40]!r} appears twice")
    for k in v:
        if k not in keys:
            src.fail((*where, k), f"unknown key {k[:40]!r}; expected one of {sorted(keys)}")
    for k, required in keys.items():
        if required and k not in v:
            src.fail(where, f"missing key {k!r}")
    return v


def _str(v: Any, where: Where, src: Source) -> str:
    if not isinstance(v, str):
        src.fail(where, f"expected a string, found {_kind(v)}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        src.fail(where, f"string is not valid Unicode ({e.reason})")
    return v


def _int(v: Any, where: Where, src: Source, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        src.fail(where, f"expected an int, found {_kind(v)}")
    if not lo <= v < hi:
        src.fail(where, f"{v} is out of range [{lo}, {hi - 1}]")
    return v


def _bool(v: Any, where: Where, src: Source) -> bool:
    if not isinstance(v, bool):
        src.fail(where, f"expected true or false, found {_kind(v)}")
    return v


def _list(v: Any, where: Where, src: Source) -> list[Any]:
    if not isinstance(v, list):
        src.fail(where, f"expected an array, found {_kind(v)}")
    return v


def _float(v: Any, where: Where, src: Source) -> float:
    if isinstance(v, float):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return float(v)
        except OverflowError:
            src.fail(where, f"int {v} is too large for a float")
    if isinstance(v, str):
        x = parse_float_text(v)
        if x is not None:
            return x
        src.fail(where, f"{v[:40]!r} is not a float; non-finite floats are spelled 'inf', '-inf', 'nan' "
                 "or 'nan:0x<16 hex digits>'")
    src.fail(where, f"expected a float, found {_kind(v)}")


def _build(src: Source, where: Where, make: Callable[[], Any]) -> Any:
    """Run a constructor of the in-memory model; its errors become FormatErrors at ``where``."""
    try:
        return make()
    except FormatError:
        raise
    except (UaiiError, ValueError, TypeError) as e:
        src.fail(where, _PREFIX.sub("", str(e)))


# --- the graph ----------------------------------------------------------------------------------------------
def graph_from_doc(doc: Any, src: Source) -> Graph:
    top = _obj(doc, (), src, _TOP_KEYS)
    version = _obj(top["ir_version"], ("ir_version",), src, _VERSION_KEYS)
    major = _int(version["major"], ("ir_version", "major"), src, 0, U32_LIMIT)
    minor = _int(version["minor"], ("ir_version", "minor"), src, 0, U32_LIMIT)
    if major != IR_VERSION[0]:
        src.fail(("ir_version", "major"), f"IR version {major}.{minor} is not supported; this reader reads "
                 f"{IR_VERSION[0]}.x")
    tensors, ids = _tensors(_list(top["tensors"], ("tensors",), src), src)
    nodes = _nodes(_list(top["nodes"], ("nodes",), src), ids, src)
    metadata = _metadata(top.get("metadata", {}), src)
    name, producer, domain = (_str(top[k], (k,), src) for k in ("name", "producer", "domain"))
    inputs = _refs(top["inputs"], ("inputs",), ids, src)
    outputs = _refs(top["outputs"], ("outputs",), ids, src)
    return _build(src, (), lambda: Graph(name=name, inputs=inputs, outputs=outputs, nodes=tuple(nodes),
                                         tensors=tuple(tensors), metadata=metadata, producer=producer,
                                         domain=domain, ir_version=(major, minor)))


def _metadata(v: Any, src: Source) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, dict):
        src.fail(("metadata",), f"expected an object, found {_kind(v)}")
    if isinstance(v, DuplicateKeys):
        src.fail(("metadata", v.duplicate), f"key {v.duplicate[:40]!r} appears twice")
    return tuple((_str(k, ("metadata",), src), _str(x, ("metadata", k), src)) for k, x in v.items())


def _refs(v: Any, where: Where, ids: dict[int, str], src: Source) -> tuple[str, ...]:
    out = []
    for j, x in enumerate(_list(v, where, src)):
        tid = _int(x, (*where, j), src, 0, U64_LIMIT)
        if tid == 0:
            out.append("")
        elif tid in ids:
            out.append(ids[tid])
        else:
            src.fail((*where, j), f"tensor id {tid} is not declared by any tensor")
    return tuple(out)


def _tensors(items: list[Any], src: Source) -> tuple[list[Tensor], dict[int, str]]:
    tensors: list[Tensor] = []
    ids: dict[int, str] = {}
    for i, item in enumerate(items):
        where: Where = ("tensors", i)
        t = _obj(item, where, src, _TENSOR_KEYS)
        tid = _int(t["id"], (*where, "id"), src, 1, U64_LIMIT)
        if tid in ids:
            src.fail((*where, "id"), f"tensor id {tid} is declared twice")
        tensor = _tensor(t, where, src)
        ids[tid] = tensor.name
        tensors.append(tensor)
    return tensors, ids


def _tensor(t: dict[str, Any], where: Where, src: Source) -> Tensor:
    name = _str(t["name"], (*where, "name"), src)
    if not name:
        src.fail((*where, "name"), "tensor name is empty ('' means an omitted input)")
    dtype_name = _str(t["dtype"], (*where, "dtype"), src)
    dtype = _build(src, (*where, "dtype"), lambda: DType.parse(dtype_name))
    qf = _str(t.get("quant_format", ""), (*where, "quant_format"), src)
    if qf and _build(src, (*where, "quant_format"), lambda: DType.parse(qf)) is not dtype:
        src.fail((*where, "quant_format"), f"quant_format {qf!r} disagrees with dtype {dtype.value!r}")
    hint = _str(t.get("storage_hint", ""), (*where, "storage_hint"), src)
    if hint not in _STORAGE:
        src.fail((*where, "storage_hint"), f"unknown storage hint {hint[:40]!r}; expected one of "
                 f"{sorted(_STORAGE)}")
    ref = _str(t.get("weight_ref", ""), (*where, "weight_ref"), src)
    weight = _build(src, (*where, "weight_ref"), lambda: WeightRef.parse(ref)) if ref else None
    data = _data(t["data"], (*where, "data"), src) if "data" in t else None
    shape = _shape(t["shape"], (*where, "shape"), src)
    is_weight = _bool(t.get("is_weight", False), (*where, "is_weight"), src)
    return _build(src, where, lambda: Tensor(name, dtype, shape, weight=weight, data=data,
                                             storage_hint=_STORAGE[hint], is_weight=is_weight))


def _shape(v: Any, where: Where, src: Source) -> tuple[int | str, ...]:
    dims: list[int | str] = []
    for j, d in enumerate(_list(v, where, src)):
        if isinstance(d, str):
            if not d.isidentifier():
                src.fail((*where, j), f"symbolic dimension {d[:40]!r} is not an identifier")
            dims.append(d)
        else:
            dims.append(_int(d, (*where, j), src, 0, I64_LIMIT))
    return tuple(dims)


def _data(v: Any, where: Where, src: Source) -> bytes:
    if isinstance(v, bytes):
        return v
    text = _str(v, where, src)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        src.fail(where, "inline data is not valid base64")
    if base64.b64encode(raw).decode("ascii") != text:
        src.fail(where, "inline data is not canonical base64 (standard alphabet, '=' padding, zero pad bits)")
    return raw


def _nodes(items: list[Any], ids: dict[int, str], src: Source) -> list[Node]:
    nodes: list[Node] = []
    seen: set[int] = set()
    for i, item in enumerate(items):
        where: Where = ("nodes", i)
        n = _obj(item, where, src, _NODE_KEYS)
        nid = _int(n["id"], (*where, "id"), src, 0, U64_LIMIT)
        if nid in seen:
            src.fail((*where, "id"), f"node id {nid} is declared twice")
        seen.add(nid)
        nodes.append(_node(n, where, ids, src))
    return nodes


def _node(n: dict[str, Any], where: Where, ids: dict[int, str], src: Source) -> Node:
    version = _op_version(n["op_version"], (*where, "op_version"), src)
    attrs = tuple(_attribute(a, (*where, "attributes", j), src)
                  for j, a in enumerate(_list(n.get("attributes", []), (*where, "attributes"), src)))
    name = _str(n["name"], (*where, "name"), src)
    op = _str(n["op_name"], (*where, "op_name"), src)
    inputs = _refs(n["inputs"], (*where, "inputs"), ids, src)
    outputs = _refs(n["outputs"], (*where, "outputs"), ids, src)
    return _build(src, where, lambda: Node(name, op, inputs, outputs, attrs, version))


def _op_version(v: Any, where: Where, src: Source) -> int:
    if isinstance(v, str) and _OP_VERSION.fullmatch(v):
        return int(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return _int(v, where, src, 0, 10**18)
    src.fail(where, f"op_version must be a decimal string such as \"1\", found {str(v)[:40]!r}")


def _attribute(v: Any, where: Where, src: Source) -> tuple[str, Attribute]:
    a = _obj(v, where, src, _ATTR_KEYS)
    key = _str(a["key"], (*where, "key"), src)
    type_name = _str(a["type"], (*where, "type"), src)
    try:
        t = AttrType(type_name)
    except ValueError:
        src.fail((*where, "type"), f"unknown attribute type {type_name[:40]!r}; expected one of "
                 f"{[x.value for x in AttrType]}")
    value = _attr_value(t, a["value"], (*where, "value"), src)
    return key, _build(src, where, lambda: Attribute(t, value))


def _attr_value(t: AttrType, v: Any, where: Where, src: Source) -> Any:
    if t is AttrType.STRING:
        return _str(v, where, src)
    if t is AttrType.INT:
        return _int(v, where, src, -I64_LIMIT, I64_LIMIT)
    if t is AttrType.FLOAT:
        return _float(v, where, src)
    if t is AttrType.BOOL:
        return _bool(v, where, src)
    items = _list(v, where, src)
    if t is AttrType.INT_ARRAY:
        return tuple(_int(x, (*where, j), src, -I64_LIMIT, I64_LIMIT) for j, x in enumerate(items))
    return tuple(_float(x, (*where, j), src) for j, x in enumerate(items))
