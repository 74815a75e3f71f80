"""The canonical ``.uaii.json`` text.

Canonical dumping, exactly: the document of :mod:`._encode` with inline constants as standard base64 (with
``=`` padding) under ``data`` and non-finite floats spelled as in :mod:`._floats`, rendered by
``json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)`` plus one ``"\\n"``,
encoded as UTF-8 without a BOM. Finite floats print in Python's shortest round-trip form, so the same graph
always gives the same bytes and reading them back gives the same bits.

Reading accepts any valid JSON with that layout (key order, whitespace and the C++ runtime's spellings are
free). Syntax errors report the byte offset of the failure; schema errors report the JSON path and the byte
offset of the offending value, found by a rescan of the text that only runs when there is an error.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from uaii.ir.errors import FormatError
from uaii.ir.graph import Graph
from uaii.ir.serialize._decode import DuplicateKeys, Source, Where, graph_from_doc
from uaii.ir.serialize._encode import graph_to_doc
from uaii.ir.serialize._floats import float_text

COMPONENT = "uaii.json"

# One JSON token after optional whitespace: a string, a punctuation mark, or a bare literal/number.
_TOKEN = re.compile(r'[ \t\r\n]*(?:("(?:[^"\\]|\\.)*")|([{}\[\]:,])|([^ \t\r\n{}\[\]:,"]+))', re.DOTALL)
_LONG_DIGITS = re.compile(r"[0-9]{4000,}")


# --- writing ------------------------------------------------------------------------------------------------
def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else float_text(x)


def _to_json(doc: dict[str, Any]) -> dict[str, Any]:
    """Render what JSON cannot hold (bytes, non-finite floats), in place: ``doc`` is ours to change."""
    for t in doc["tensors"]:
        if "data" in t:
            t["data"] = base64.b64encode(t["data"]).decode("ascii")
    for n in doc["nodes"]:
        for a in n["attributes"]:
            if a["type"] == "float":
                a["value"] = _json_float(a["value"])
            elif a["type"] == "float_array":
                a["value"] = [_json_float(x) for x in a["value"]]
    return doc


def dumps_json(graph: Graph) -> str:
    """The canonical JSON text of ``graph`` (ends with a newline)."""
    doc = _to_json(graph_to_doc(graph))
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


# --- reading ------------------------------------------------------------------------------------------------
def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                return DuplicateKeys(pairs, k)
            seen.add(k)
    return d


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8", "surrogatepass"))


def loads_json(data: str | bytes, *, path: str | None = None) -> Graph:
    """Read a ``.uaii.json`` document; every failure is a FormatError with a byte offset."""
    if isinstance(data, bytes | bytearray | memoryview):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"invalid UTF-8 ({e.reason})", path=path, offset=e.start,
                              component=COMPONENT) from None
    else:
        text = data
    doc = _parse(text, path)
    return graph_from_doc(doc, Source(path, COMPONENT, lambda where: locate(text, where)))


def _parse(text: str, path: str | None) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as e:
        raise FormatError(f"invalid JSON: {e.msg}", path=path, offset=_byte_offset(text, e.pos),
                          component=COMPONENT) from None
    except RecursionError:
        raise FormatError("invalid JSON: nesting too deep", path=path,
                          offset=_byte_offset(text, _deepest(text)), component=COMPONENT) from None
    except ValueError as e:  # e.g. an integer literal longer than Python's int-digit limit
        m = _LONG_DIGITS.search(text)
        raise FormatError(f"invalid JSON: {e}", path=path, offset=_byte_offset(text, m.start() if m else 0),
                          component=COMPONENT) from None


# --- locating a document path in the text (error reporting only) --------------------------------------------
def _tokens(text: str, pos: int) -> tuple[str, int, int]:
    """(token, start, end) of the token at ``pos``; ("", len, len) at the end."""
    m = _TOKEN.match(text, pos)
    if m is None or m.lastindex is None:
        return "", len(text), len(text)
    return m.group(m.lastindex), m.start(m.lastindex), m.end()


def _skip_value(text: str, pos: int) -> int:
    """End of the value starting at ``pos`` (iterative, so deep nesting cannot recurse)."""
    depth = 0
    while True:
        tok, _, pos = _tokens(text, pos)
        if tok in ("{", "["):
            depth += 1
        elif tok in ("}", "]"):
            depth -= 1
        if depth <= 0 or not tok:
            return pos


def _step(text: str, pos: int, key: str | int) -> int | None:
    """Start of member ``key`` of the object/array whose value starts at ``pos``, or None."""
    tok, _, pos = _tokens(text, pos)
    if tok not in ("{", "["):
        return None
    index = 0
    while True:
        tok, start, end = _tokens(text, pos)
        if tok in ("}", "]", ""):
            return None
        if tok == ",":
            pos = end
            continue
        if isinstance(key, str):
            colon_end = _tokens(text, end)[2]
            if tok.startswith('"') and json.loads(tok) == key:
                return _tokens(text, colon_end)[1]
            pos = _skip_value(text, colon_end)
        else:
            if index == key:
                return start
            pos = _skip_value(text, start)
        index += 1


def locate(text: str, where: Where) -> int | None:
    """Byte offset of the value at document path ``where`` (or of its nearest ancestor that exists)."""
    pos = _tokens(text, 0)[1]
    for key in where:
        nxt = _step(text, pos, key)
        if nxt is None:
            break
        pos = nxt
    return _byte_offset(text, pos)


def _deepest(text: str) -> int:
    """Index of the first bracket that reaches the deepest nesting level."""
    depth = best = at = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text, re.DOTALL):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > best:
                best, at = depth, m.start()
        elif c in "]}":
            depth -= 1
    return at
