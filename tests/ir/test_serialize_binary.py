"""Codec 2 (.uaii FlatBuffers): header, determinism, the schema ↔ verifier ↔ generated code agreement, and the
verifier's checks on hostile buffers."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import time
from pathlib import Path

import flatbuffers
import pytest

from uaii.ir import DType, FormatError, Graph, GraphError, Node, Tensor
from uaii.ir._fbs import Dim as fb_dim
from uaii.ir._fbs import Graph as fb_graph
from uaii.ir._fbs import Tensor as fb_tensor
from uaii.ir._fbs.Graph import Graph as FbGraph
from uaii.ir.serialize import from_bytes, to_bytes
from uaii.ir.serialize._flatbuf import SCHEMA, FlatReader
from uaii.ir.serialize.binary_v2 import DTYPE_CODES
from uaii.ir.serialize.reader import pack_header

REPO = Path(__file__).resolve().parents[2]


import serialize_support as S  # noqa: E402  (tests/ir is on pytest's pythonpath)


def error_of(data: bytes) -> FormatError:
    with pytest.raises(FormatError) as e:
        from_bytes(data, path="m.uaii")
    assert e.value.path == "m.uaii" and e.value.offset is not None
    assert 0 <= e.value.offset <= len(data)
    return e.value


def root_of(data: bytes):  # type: ignore[no-untyped-def]
    return FlatReader(data[16:], base=16, path=None, component="test").root()


# --- layout and determinism --------------------------------------------------------------------------------
def test_header() -> None:
    data = to_bytes(S.toy_mlp())
    assert struct.unpack_from("<4sIII", data) == (b"UAIR", 2, 1, 0)
    assert struct.unpack_from("<4sIII", to_bytes(S.rich_graph()))[2:] == (1, 1)


def test_same_graph_same_bytes() -> None:
    a = S.rich_graph()
    b = Graph(a.name, a.inputs, a.outputs, a.nodes, a.tensors, metadata=tuple(reversed(a.metadata)))
    assert to_bytes(a) == to_bytes(b) == to_bytes(from_bytes(to_bytes(a)))


def test_weights_are_never_embedded() -> None:
    g = S.rich_graph()
    data = to_bytes(g)
    assert len(data) < 4096
    assert b"m.gguf#ffn_up_exps#e=3" in data


def test_unrepresentable_graph_raises_graph_error() -> None:
    with pytest.raises(GraphError):
        to_bytes(Graph("g", (), (), (Node("n", "Op", ("missing",), ()),), ()))


# --- schema ↔ verifier ↔ generated code --------------------------------------------------------------------
_KIND = {"long": ("scalar", "q"), "ulong": ("scalar", "Q"), "double": ("scalar", "d"),
         "bool": ("scalar", "?"), "ubyte": ("scalar", "B"), "string": ("string", "")}


def _fbs_tables() -> tuple[dict[str, list[tuple[str, str]]], set[str]]:
    text = re.sub(r"//[^\n]*", "", (REPO / "schemas" / "uaii_ir.fbs").read_text(encoding="utf-8"))
    enums = set(re.findall(r"enum (\w+) : ubyte", text))
    tables = {name: re.findall(r"(\w+)\s*:\s*([\[\]\w]+)\s*;", body)
              for name, body in re.findall(r"table (\w+) \{(.*?)\}", text, re.DOTALL)}
    return tables, enums


def test_verifier_schema_mirrors_the_fbs_file() -> None:
    tables, enums = _fbs_tables()
    assert set(tables) == set(SCHEMA)
    for name, fields in tables.items():
        expected = []
        for fname, ftype in fields:
            if ftype.startswith("["):
                inner = ftype[1:-1]
                kind = ("tables", inner) if inner in tables else ("vector", _KIND[inner][1])
                expected.append((fname, *kind))
            else:
                expected.append((fname, *(("scalar", "B") if ftype in enums else _KIND[ftype])))
        assert [tuple(f) for f in SCHEMA[name]] == expected, name


def test_dtype_enum_covers_every_dtype() -> None:
    assert set(DTYPE_CODES) == {d.value for d in DType}
    codec1 = {"f32": 1, "f16": 2, "bf16": 3, "i8": 4, "i32": 5, "i64": 6, "u8": 7, "u32": 8, "bool": 9}
    for d in DType:
        if d.is_quantized:
            assert DTYPE_CODES[d.value] == 64 + (d.gguf_id or 0)
        elif d.value in codec1:
            assert DTYPE_CODES[d.value] == codec1[d.value]


def test_generated_accessors_read_what_we_write() -> None:
    g = S.rich_graph()
    fb = FbGraph.GetRootAs(to_bytes(g), 16)
    assert fb.Name().decode() == g.name
    assert fb.TensorsLength() == len(g.tensors)
    for i, t in enumerate(g.tensors):
        ft = fb.Tensors(i)
        assert ft.Id() == i + 1 and ft.Name().decode() == t.name and ft.Dtype() == DTYPE_CODES[t.dtype.value]
        dims = [ft.Shape(j).Symbol().decode() if ft.Shape(j).Symbol() else ft.Shape(j).Size()
                for j in range(ft.ShapeLength())]
        assert tuple(dims) == t.shape
        assert ft.DataIsNone() == (t.data is None)
        if t.data is not None:
            assert bytes(ft.DataAsNumpy()) == t.data
    node = fb.Nodes(1)
    assert node.OpVersion() == b"2" and list(node.InputsAsNumpy()) == [5, 4]
    keys = [node.Attributes(j).Key().decode() for j in range(node.AttributesLength())]
    assert keys == sorted(dict(g.nodes[1].attributes))
    neg = node.Attributes(keys.index("neg"))
    assert struct.pack("<d", neg.F()) == struct.pack("<d", -0.0)


@pytest.mark.skipif(shutil.which("flatc") is None and not os.environ.get("FLATC"),
                    reason="flatc not installed")
def test_generated_flatbuffers_code_is_current(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("uaii_scripts_gen", REPO / "scripts" / "gen.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate_fbs(tmp_path / "_fbs")
    stale = gen.diff_summary("_fbs", gen._files(gen.FBS_DIR), gen._files(tmp_path / "_fbs"))
    assert not stale, "run `make gen`:\n" + "\n".join(stale)


# --- hostile buffers ---------------------------------------------------------------------------------------
def test_header_errors() -> None:
    data = to_bytes(S.toy_mlp())
    assert error_of(b"UAI").offset == 3
    assert error_of(b"GGUF" + data[4:]).offset == 0
    e = error_of(data[:4] + struct.pack("<I", 3) + data[8:])
    assert e.offset == 4 and "codec version 3" in str(e)
    assert "not supported" in str(error_of(data[:8] + struct.pack("<I", 2) + data[12:]))


def test_root_offset_outside_buffer() -> None:
    data = to_bytes(S.toy_mlp())
    e = error_of(data[:16] + struct.pack("<I", 1 << 20) + data[20:])
    assert "outside the buffer" in str(e)


def test_lying_vector_length_fails_fast_without_allocating() -> None:
    import tracemalloc

    data = bytearray(to_bytes(S.rich_graph()))
    at = 16 + root_of(bytes(data)).at["tensors"] - 4  # the tensors vector's length
    struct.pack_into("<I", data, at, 0xFFFFFFFF)
    tracemalloc.start()
    t0 = time.perf_counter()
    e = error_of(bytes(data))
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert e.offset == at and elapsed < 0.1 and peak < 1 << 20


def test_unterminated_string_and_bad_utf8() -> None:
    g = Graph("abcdef", (), (), (), ())
    data = bytearray(to_bytes(g))
    pos = data.index(b"abcdef")
    bad = bytearray(data)
    bad[pos + 6] = 0x41
    assert "zero-terminated" in str(error_of(bytes(bad)))
    bad = bytearray(data)
    bad[pos] = 0xFF
    assert error_of(bytes(bad)).offset == pos


def test_unknown_enum_code_names_the_field() -> None:
    g = Graph("g", (), (), (), (Tensor("t", DType.F32, (2,)),))
    data = bytearray(to_bytes(g))
    t = root_of(bytes(data)).values["tensors"][0]
    data[16 + t.at["dtype"]] = 200
    e = error_of(bytes(data))
    assert "$.tensors[0].dtype" in str(e) and "unknown dtype code 200" in str(e)
    assert e.offset == 16 + t.at["dtype"]


def test_shared_objects_exhaust_the_work_budget_quickly() -> None:
    """Thousands of references to one tensor with thousands of dims: a small file, a huge expansion."""
    b = flatbuffers.Builder(1024)
    dims = []
    for _ in range(3000):
        fb_dim.Start(b)
        fb_dim.AddSize(b, 1)
        dims.append(fb_dim.End(b))
    b.StartVector(4, len(dims), 4)
    for d in reversed(dims):
        b.PrependUOffsetTRelative(d)
    shape = b.EndVector()
    fb_tensor.Start(b)
    fb_tensor.AddId(b, 1)
    fb_tensor.AddShape(b, shape)
    tensor = fb_tensor.End(b)
    b.StartVector(4, 3000, 4)
    for _ in range(3000):
        b.PrependUOffsetTRelative(tensor)
    tensors = b.EndVector()
    fb_graph.Start(b)
    fb_graph.AddTensors(b, tensors)
    b.Finish(fb_graph.End(b))
    data = pack_header(2, 1, 1) + bytes(b.Output())
    t0 = time.perf_counter()
    e = error_of(data)
    assert "work budget" in str(e) and time.perf_counter() - t0 < 2.0
