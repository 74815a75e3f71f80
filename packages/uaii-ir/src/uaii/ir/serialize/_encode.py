"""Graph → document: the file model every writer starts from.

A *document* is the JSON layout as plain Python values (dicts, lists, str, int, bool, float), with two
exceptions that each writer renders its own way: floats are raw Python floats (non-finite included) and an
inline constant is ``bytes``. Tensor and node ids are assigned here, in declaration order from 1; ``""`` (an
omitted optional input or output) becomes id 0.

Graphs a file cannot represent raise :class:`GraphError` before anything is written: a reference to an
undeclared tensor, a tensor without a name, an int that does not fit the file's integer type, a string that is
not valid Unicode, duplicate metadata keys.
"""

from __future__ import annotations

from typing import Any

from uaii.ir.errors import GraphError
from uaii.ir.graph import Attribute, AttrType, Graph, Node, StorageHint, Tensor

U32_LIMIT = 1 << 32
I64_LIMIT = 1 << 63
MAX_OP_VERSION = 10**18  # op_version is a decimal string of at most 18 digits in files

STORAGE_CODES = {StorageHint.UNSPECIFIED: 0, StorageHint.RAM: 1, StorageHint.MMAP: 2, StorageHint.EXTERNAL: 3}


def text(value: str, what: str) -> str:
    """``value`` if it can be stored as UTF-8 (no lone surrogates), else a GraphError naming ``what``."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GraphError(f"{what} {value!r} is not valid Unicode ({e.reason} at index {e.start})") from None
    return value


def graph_to_doc(graph: Graph) -> dict[str, Any]:
    """The document of ``graph``; raises GraphError when a file cannot represent it."""
    major, minor = graph.ir_version
    for part in (major, minor):
        if not (isinstance(part, int) and 0 <= part < U32_LIMIT):
            raise GraphError(f"graph {graph.name!r}: IR version {graph.ir_version} must be two u32 values")
    ids: dict[str, int] = {}
    for i, t in enumerate(graph.tensors, start=1):
        if not t.name:
            raise GraphError(f"graph {graph.name!r}: tensor {i} has an empty name; files reference tensors "
                             "by name and '' means an omitted input")
        ids.setdefault(t.name, i)
    meta = dict(graph.metadata)
    if len(meta) != len(graph.metadata):
        raise GraphError(f"graph {graph.name!r} has duplicate metadata keys")

    def refs(names: tuple[str, ...], where: str) -> list[int]:
        out = []
        for n in names:
            if n and n not in ids:
                raise GraphError(f"graph {graph.name!r}: {where} references {n!r}, which no tensor declares")
            out.append(ids[n] if n else 0)
        return out

    return {
        "ir_version": {"major": major, "minor": minor},
        "name": text(graph.name, "graph name"),
        "producer": text(graph.producer, "producer"),
        "domain": text(graph.domain, "domain"),
        "tensors": [_tensor_doc(i, t) for i, t in enumerate(graph.tensors, start=1)],
        "nodes": [_node_doc(i, n, refs) for i, n in enumerate(graph.nodes, start=1)],
        "inputs": refs(graph.inputs, "graph input"),
        "outputs": refs(graph.outputs, "graph output"),
        "metadata": {text(k, "metadata key"): text(v, "metadata value") for k, v in meta.items()},
    }


def _tensor_doc(tid: int, t: Tensor) -> dict[str, Any]:
    shape: list[int | str] = []
    for d in t.shape:
        if isinstance(d, int) and d >= I64_LIMIT:
            raise GraphError(f"tensor {t.name!r}: dimension {d} does not fit in a signed 64-bit integer")
        shape.append(text(d, "symbolic dimension") if isinstance(d, str) else d)
    doc: dict[str, Any] = {
        "id": tid,
        "name": text(t.name, "tensor name"),
        "dtype": t.dtype.value,
        "quant_format": t.dtype.value,
        "shape": shape,
        "storage_hint": t.storage_hint.value,
        "is_weight": t.is_weight,
        "weight_ref": text(str(t.weight), "weight reference") if t.weight is not None else "",
    }
    if t.data is not None:
        doc["data"] = bytes(t.data)
    return doc


def _node_doc(nid: int, n: Node, refs: Any) -> dict[str, Any]:
    if isinstance(n.version, bool) or not isinstance(n.version, int) or not 0 <= n.version < MAX_OP_VERSION:
        raise GraphError(f"node {n.name!r}: op version {n.version!r} must be an int in [0, 10^18)")
    return {
        "id": nid,
        "name": text(n.name, "node name"),
        "op_name": text(n.op, "op name"),
        "op_version": str(n.version),
        "inputs": refs(n.inputs, f"node {n.name!r} input"),
        "outputs": refs(n.outputs, f"node {n.name!r} output"),
        "attributes": [_attr_doc(n, k, a) for k, a in n.attributes],
    }


def _attr_doc(n: Node, key: str, a: Attribute) -> dict[str, Any]:
    value: Any = a.value
    if a.type is AttrType.STRING:
        value = text(value, f"node {n.name!r} attribute {key!r}")
    elif a.type in (AttrType.INT_ARRAY, AttrType.FLOAT_ARRAY):
        value = list(value)
    return {"key": text(key, f"node {n.name!r} attribute key"), "type": a.type.value, "value": value}
