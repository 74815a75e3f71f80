"""The ONNX file layer: every initializer ends up as exact bytes in a file or as the values onnx itself reads.

Models are built with onnx.helper; onnx.numpy_helper.to_array is the reference for every value. Each weight
reference is checked byte for byte against the file at the offset it names.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uaii.ir import DType, FormatError
from uaii.loaders.errors import MissingDependency
from uaii.loaders.index import TensorInfo
from uaii.loaders.onnx import dtypes
from uaii.loaders.onnx.proto import WorkCounter, WorkLimitExceeded, encode_varint
from uaii.loaders.onnx.reader import INLINE_BELOW, OnnxFile, open_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# element type -> numpy type of random test values
NUMPY = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
         TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
         TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64,
         TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64, TensorProto.BOOL: np.bool_}
SUBBYTE = (TensorProto.INT4, TensorProto.UINT4)


def _values(code: int, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    if code == TensorProto.BFLOAT16:
        import ml_dtypes  # onnx's own dependency: bfloat16 values for its helpers
        return rng.standard_normal(n).astype(ml_dtypes.bfloat16).reshape(shape)
    if code == TensorProto.INT4:
        return rng.integers(-8, 8, n).astype(np.int8).reshape(shape)
    if code == TensorProto.UINT4:
        return rng.integers(0, 16, n).astype(np.uint8).reshape(shape)
    dt = np.dtype(NUMPY[code])
    if dt.kind == "f":
        return rng.standard_normal(n).astype(dt).reshape(shape)
    if dt.kind == "b":
        return (rng.integers(0, 2, n) == 1).reshape(shape)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).reshape(shape)


def _tensor(name: str, code: int, values: np.ndarray, raw: bool) -> Any:
    if code in SUBBYTE:
        return helper.make_tensor(name, code, values.shape, values.astype(np.int8 if code == TensorProto.INT4
                                                                           else np.uint8), raw=raw)
    if raw:
        return numpy_helper.from_array(values, name)
    return helper.make_tensor(name, code, values.shape, values.reshape(-1))


def _model(initializers: list[Any], nodes: list[Any] | None = None, opsets: dict[str, int] | None = None,
           **graph: Any) -> Any:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])]
    g = helper.make_graph(nodes or [helper.make_node("Identity", ["x"], ["y"])], "main", inputs, outputs,
                          initializers, **graph)
    ops = [helper.make_opsetid(d, v) for d, v in (opsets or {"": 18}).items()]
    return helper.make_model(g, opset_imports=ops)


def _save(tmp_path: Path, model: Any, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def _same(got: np.ndarray, tensor: Any) -> None:
    """``got`` holds exactly the values onnx reads from ``tensor`` (bits compared for floats)."""
    ref = numpy_helper.to_array(tensor)
    assert got.shape == ref.shape
    if tensor.data_type == TensorProto.BFLOAT16:
        assert got.dtype == np.uint16
        np.testing.assert_array_equal(got, ref.view(np.uint16))
    elif tensor.data_type in SUBBYTE:
        assert got.dtype == (np.int8 if tensor.data_type == TensorProto.INT4 else np.uint8)
        np.testing.assert_array_equal(got, ref.astype(got.dtype))
    else:
        assert got.dtype == ref.dtype
        assert got.tobytes() == np.ascontiguousarray(ref).tobytes()


def _file_bytes(info: TensorInfo) -> bytes:
    with open(info.file, "rb") as f:
        f.seek(info.offset)
        return f.read(info.nbytes)


ALL_CODES = sorted([*NUMPY, TensorProto.BFLOAT16, *SUBBYTE])


# --- values -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ALL_CODES, ids=lambda c: TensorProto.DataType.Name(c))
def test_raw_weights_point_at_their_bytes_in_the_onnx_file(tmp_path: Path, code: int) -> None:
    rng = np.random.default_rng(code)
    big = _tensor("big", code, _values(code, (9, 40), rng), raw=True)
    small = _tensor("small", code, _values(code, (3,), rng), raw=True)
    f = open_onnx(_save(tmp_path, _model([big, small])))
    t = dtypes.onnx_type(code)
    assert t is not None
    if t.dtype is None:  # uint16, uint64: no UAII element type, so materialized rather than referenced
        assert set(f.inline) == {"big", "small"} and not f.weights
        _same(f.value("big"), big)
        return
    info = f.weights["big"]
    assert info.file == str(f.path) == os.path.realpath(tmp_path / "model.onnx")
    assert info.nbytes == len(big.raw_data)
    assert info.dtype == t.dtype
    assert info.shape == ((len(big.raw_data),) if code in SUBBYTE else (9, 40))
    assert _file_bytes(info) == big.raw_data
    assert "big" not in f.inline and "small" not in f.weights
    assert f.shapes["big"] == (9, 40) and f.onnx_types["big"] == code
    _same(f.value("big"), big)
    _same(f.value("small"), small)


@pytest.mark.parametrize("code", ALL_CODES, ids=lambda c: TensorProto.DataType.Name(c))
def test_typed_fields_are_materialized_as_onnx_reads_them(tmp_path: Path, code: int) -> None:
    rng = np.random.default_rng(100 + code)
    tensors = [_tensor(f"t{i}", code, _values(code, shape, rng), raw=False)
               for i, shape in enumerate([(5, 7), (1,), (), (0, 3), (3, 0, 2)])]
    f = open_onnx(_save(tmp_path, _model(tensors)))
    assert not f.weights
    for t in tensors:
        _same(f.value(t.name), t)
        assert not f.inline[t.name].flags.writeable


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.sampled_from(ALL_CODES), shape=st.lists(st.integers(0, 6), max_size=4).map(tuple),
       raw=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_any_initializer_reads_back_exactly(tmp_path: Path, code: int, shape: tuple[int, ...], raw: bool,
                                            seed: int) -> None:
    tensor = _tensor("w", code, _values(code, shape, np.random.default_rng(seed)), raw=raw)
    f = open_onnx(_save(tmp_path, _model([tensor])))
    _same(f.value("w"), tensor)
    if "w" in f.weights:
        assert raw and f.weights["w"].nbytes >= INLINE_BELOW
        assert _file_bytes(f.weights["w"]) == tensor.raw_data


def test_int4_is_kept_packed_and_value_unpacks_it(tmp_path: Path) -> None:
    vals = np.array([-8, -1, 0, 3, 7, 5, -3], dtype=np.int8)  # odd count: the last byte is half used
    big = helper.make_tensor("q", TensorProto.INT4, [256, 3], np.resize(vals, 768), raw=True)
    small = helper.make_tensor("s", TensorProto.UINT4, [7], (vals + 8).astype(np.uint8), raw=False)
    f = open_onnx(_save(tmp_path, _model([big, small])))
    assert f.weights["q"].dtype == DType.U8 and f.weights["q"].shape == (384,)
    assert f.inline["s"].dtype == np.uint8 and f.inline["s"].shape == (4,)  # packed bytes, as stored
    assert f.inline["s"][0] == (0 | (7 << 4))  # low nibble first
    np.testing.assert_array_equal(f.value("q"), np.resize(vals, 768).reshape(256, 3))
    np.testing.assert_array_equal(f.value("s"), vals + 8)


def test_scalars_and_zero_size_tensors(tmp_path: Path) -> None:
    scalar = numpy_helper.from_array(np.array(3.5, np.float32), "scalar")
    empty_raw = numpy_helper.from_array(np.zeros((0, 4), np.float32), "empty_raw")
    empty = helper.make_tensor("empty", TensorProto.INT64, [2, 0], [])
    f = open_onnx(_save(tmp_path, _model([scalar, empty_raw, empty])))
    assert f.value("scalar").shape == () and f.value("scalar") == np.float32(3.5)
    assert f.value("empty_raw").shape == (0, 4) and f.value("empty").shape == (2, 0)
    assert f.value("empty").dtype == np.int64


def test_value_refuses_above_its_limit_and_unknown_names(tmp_path: Path) -> None:
    f = open_onnx(_save(tmp_path, _model([numpy_helper.from_array(np.ones((64, 64), np.float32), "w")])))
    assert f.value("w", limit=64 * 64 * 4).shape == (64, 64)
    with pytest.raises(FormatError, match="limited to 100 bytes"):
        f.value("w", limit=100)
    with pytest.raises(Exception, match="no initializer named 'nope'"):
        f.value("nope")


def test_value_of_a_weight_notices_a_file_cut_short(tmp_path: Path) -> None:
    path = _save(tmp_path, _model([numpy_helper.from_array(np.ones((64, 64), np.float32), "w")]))
    f = open_onnx(path)
    os.truncate(path, f.weights["w"].offset + 10)
    with pytest.raises(FormatError, match="ended after 10 of its 16384 bytes") as err:
        f.value("w")
    assert err.value.offset == f.weights["w"].offset


# --- the stripped model ---------------------------------------------------------------------------------------


def test_the_model_holds_no_weight_bytes(tmp_path: Path) -> None:
    w = numpy_helper.from_array(np.ones((256, 256), np.float32), "w")
    typed = helper.make_tensor("t", TensorProto.INT64, [1000], list(range(1000)))
    path = _save(tmp_path, _model([w, typed], nodes=[helper.make_node("Identity", ["x"], ["y"], name="id")],
                                  opsets={"": 17, "com.microsoft": 1, "ai.onnx": 17}))
    f = open_onnx(path)
    assert f.model.ByteSize() < 1000 < path.stat().st_size // 100
    for init in f.model.graph.initializer:
        assert not init.raw_data and not init.int64_data and not init.external_data
        assert init.data_location == TensorProto.DEFAULT
    assert [(i.name, list(i.dims), i.data_type) for i in f.model.graph.initializer] == \
        [("w", [256, 256], TensorProto.FLOAT), ("t", [1000], TensorProto.INT64)]
    assert f.model.graph.node[0].name == "id" and f.model.graph.input[0].name == "x"
    assert dict(f.opsets) == {"": 17, "com.microsoft": 1}


def test_conflicting_opsets_and_files_that_are_not_models(tmp_path: Path) -> None:
    bad = _model([], opsets={"": 17, "ai.onnx": 18})
    with pytest.raises(FormatError, match="twice, as versions 17 and 18"):
        open_onnx(_save(tmp_path, bad))
    (tmp_path / "text.onnx").write_bytes(b"hello, this is not a model")
    with pytest.raises(FormatError, match=r"text\.onnx"):
        open_onnx(tmp_path / "text.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(FormatError, match="empty file") as err:
        open_onnx(tmp_path / "empty.onnx")
    assert err.value.offset == 0
    no_graph = helper.make_model(helper.make_graph([], "g", [], []))
    no_graph.ClearField("graph")
    with pytest.raises(FormatError, match="and no graph"):
        open_onnx(_save(tmp_path, no_graph, "nograph.onnx"))
    with pytest.raises(FormatError, match="cannot read: No such file"):
        open_onnx(tmp_path / "missing.onnx")
    with pytest.raises(FormatError, match="cannot read: embedded null byte"):
        open_onnx(f"{tmp_path}/a\0.onnx")
    with pytest.raises(FormatError, match="not a regular file"):
        open_onnx(tmp_path)


def test_nested_graph_initializers_are_found(tmp_path: Path) -> None:
    then_w = numpy_helper.from_array(np.full((8, 4), 2.0, np.float32), "then_w")
    else_w = helper.make_tensor("else_w", TensorProto.FLOAT, [2], [1.0, 2.0])
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    then_g = helper.make_graph([helper.make_node("Identity", ["then_w"], ["y"])], "then", [], out, [then_w])
    else_g = helper.make_graph([helper.make_node("Identity", ["else_w"], ["y"])], "else", [], out, [else_w])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")
    c = numpy_helper.from_array(np.array(True), "c")
    f = open_onnx(_save(tmp_path, _model([c], nodes=[node])))
    assert set(f.weights) == {"then_w"} and set(f.inline) == {"c", "else_w"}
    assert _file_bytes(f.weights["then_w"]) == then_w.raw_data
    sub = f.model.graph.node[0].attribute
    assert all(not t.raw_data and not t.float_data for a in sub for t in a.g.initializer)
    dup = numpy_helper.from_array(np.ones(2, np.float32), "then_w")
    with pytest.raises(FormatError, match="two initializers are named 'then_w'"):
        open_onnx(_save(tmp_path, _model([c, dup], nodes=[node]), "dup.onnx"))


def test_small_sparse_initializers_are_densified_large_ones_refused(tmp_path: Path) -> None:
    values = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([1, 6], np.int64), "sp_idx")
    sparse = helper.make_sparse_tensor(values, indices, [2, 4])
    f = open_onnx(_save(tmp_path, _model([], sparse_initializer=[sparse])))
    np.testing.assert_array_equal(f.value("sp"), np.array([[0, 1.5, 0, 0], [0, 0, -2.0, 0]], np.float32))
    coords = numpy_helper.from_array(np.array([[0, 1], [1, 2]], np.int64), "sp_idx")
    f = open_onnx(_save(tmp_path, _model([], sparse_initializer=[helper.make_sparse_tensor(values, coords, [2, 4])]),
                        "coo.onnx"))
    np.testing.assert_array_equal(f.value("sp"), np.array([[0, 1.5, 0, 0], [0, 0, -2.0, 0]], np.float32))
    huge = helper.make_sparse_tensor(values, indices, [1 << 20, 1 << 10])
    with pytest.raises(FormatError, match="sparse initializers are not supported"):
        open_onnx(_save(tmp_path, _model([], sparse_initializer=[huge]), "huge.onnx"))
    bad = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([6, 1], np.int64), "i"), [2, 4])
    with pytest.raises(FormatError, match="strictly increasing"):
        open_onnx(_save(tmp_path, _model([], sparse_initializer=[bad]), "bad.onnx"))


def test_constant_nodes_keep_their_values(tmp_path: Path) -> None:
    value = numpy_helper.from_array(np.arange(100, dtype=np.float32), "v")
    node = helper.make_node("Constant", [], ["y"], value=value, name="const")
    f = open_onnx(_save(tmp_path, _model([], nodes=[node])))
    np.testing.assert_array_equal(numpy_helper.to_array(f.model.graph.node[0].attribute[0].t),
                                  np.arange(100, dtype=np.float32))


# --- refusals -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tensor", "message"), [
    (helper.make_tensor("s", TensorProto.STRING, [1], [b"x"]), "element type string: string tensors"),
    (helper.make_tensor("c", TensorProto.COMPLEX64, [1], [1 + 2j]), "complex tensors are not supported"),
    (helper.make_tensor("f8", TensorProto.FLOAT8E4M3FN, [2], [1.0, 2.0]), "float8e4m3fn: 8-bit floats"),
    (TensorProto(name="u", data_type=TensorProto.UNDEFINED, dims=[1], raw_data=b"\0"), "UNDEFINED"),
])
def test_unsupported_element_types_are_refused_by_name(tmp_path: Path, tensor: Any, message: str) -> None:
    with pytest.raises(FormatError, match=message) as err:
        open_onnx(_save(tmp_path, _model([tensor])))
    assert err.value.path == os.path.realpath(tmp_path / "model.onnx") and err.value.offset is not None


def _raw(name: str, code: int, dims: list[int], data: bytes) -> Any:
    return TensorProto(name=name, data_type=code, dims=dims, raw_data=data)


@pytest.mark.parametrize(("tensor", "message"), [
    (_raw("w", TensorProto.FLOAT, [4, 4], b"\0" * 60), r"raw_data is 60 bytes; a float tensor of shape \[4, 4\] "
     "needs 64"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3], float_data=[1.0, 2.0]),
     "float_data holds 2 values; a float tensor of shape \\[3\\] needs 3"),
    (TensorProto(name="w", data_type=TensorProto.INT64, dims=[1], float_data=[1.0]),
     "its values are in float_data; a int64 tensor keeps them in int64_data"),
    (TensorProto(name="w", data_type=TensorProto.UINT8, dims=[1], int32_data=[300]),
     r"int32_data holds 300, outside \[-128, 255\]"),
    (TensorProto(name="w", data_type=TensorProto.BOOL, dims=[1], int32_data=[2]), "outside \\[0, 1\\]"),
    (TensorProto(name="w", data_type=TensorProto.UINT32, dims=[1], uint64_data=[1 << 40]), "outside the range"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1], float_data=[1.0], raw_data=b"\0" * 4),
     "both raw_data and float_data"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 2]), "holds no data"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[0, 1 << 62]), "too large for any tensor"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 1 << 62], raw_data=b"\0" * 8),
     "too large for any tensor"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1], int32_data=[1], float_data=[1.0]),
     "spread over float_data and int32_data"),
    (_raw("w", TensorProto.BOOL, [64], b"\x02" * 64), None),  # a weight: bytes are not read at open
    (_raw("", TensorProto.FLOAT, [1], b"\0" * 4), "an initializer has no name"),
    (_raw("w", 99, [1], b"\0"), "data_type 99 is not an ONNX element type"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1], raw_data=b"\0" * 4,
                 segment=TensorProto.Segment(begin=0, end=1)), "segmented tensors"),
    (TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1], raw_data=b"\0" * 4,
                 external_data=[onnx.StringStringEntryProto(key="location", value="x")]),
     "external_data entries but its data_location is not EXTERNAL"),
])
def test_tensors_that_lie_are_refused_with_file_and_offset(tmp_path: Path, tensor: Any, message: str | None) -> None:
    path = _save(tmp_path, _model([tensor]))
    if message is None:
        f = open_onnx(path)
        with pytest.raises(FormatError, match="a bool tensor holds a byte other than 0 and 1"):
            f.value("w")
        return
    with pytest.raises(FormatError, match=message) as err:
        open_onnx(path)
    assert err.value.path == os.path.realpath(path) and err.value.offset is not None
    assert str(err.value).startswith("[onnx] ")


def _field(number: int, wire: int, payload: bytes) -> bytes:
    tag = encode_varint(number << 3 | wire)
    return tag + (encode_varint(len(payload)) + payload if wire == 2 else payload)


def test_wire_format_errors_name_the_offset(tmp_path: Path) -> None:
    good = _model([numpy_helper.from_array(np.ones(32, np.float32), "w")]).SerializeToString()
    cases = {
        "cut.onnx": (good[:-3], "cut off|bytes long but only"),
        "deep.onnx": (_deep(80), "nested more than 64 deep"),
        "group.onnx": (good + _field(30, 3, b""), "wire type 3"),
        "utf8.onnx": (good + _field(2, 2, b"\xff\xfe"), "ModelProto.producer_name is not valid UTF-8"),
        "enum.onnx": (good + _field(7, 2, _field(1, 2, _field(5, 2, _field(20, 0, b"\x63")))),
                      "AttributeProto.type is 99, which is not one of its enum values"),
        "packed.onnx": (good + _field(7, 2, _field(1, 2, _field(5, 2, _field(7, 2, b"\0\0\0")))),
                        "AttributeProto.floats is packed into 3 bytes"),
        "wire.onnx": (good + _field(7, 0, b"\x01"), "ModelProto.graph has wire type 0, expected 2"),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(FormatError, match=message) as err:
            open_onnx(tmp_path / name)
        assert err.value.offset is not None, name


def _deep(levels: int) -> bytes:
    """A model whose graph nests If-subgraphs ``levels`` messages deep (3 per graph)."""
    inner = b""
    for _ in range(levels // 3):
        inner = _field(1, 2, _field(5, 2, _field(6, 2, inner)))  # graph.node -> attribute -> g
    return _field(1, 0, b"\x08") + _field(7, 2, inner)


def test_onnx_parse_errors_become_format_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever onnx's parser still rejects after the walk comes back as a FormatError, not a DecodeError."""
    import uaii.loaders.onnx.reader as reader

    class Broken:
        class ModelProto:
            DESCRIPTOR = onnx.ModelProto.DESCRIPTOR

            def ParseFromString(self, data: bytes) -> None:  # protobuf's method name
                from google.protobuf.message import DecodeError
                raise DecodeError("Error parsing message")

    monkeypatch.setattr(reader, "require", lambda *a: Broken)
    with pytest.raises(FormatError, match="onnx cannot parse the model \\(DecodeError"):
        open_onnx(_save(tmp_path, _model([])))


def test_missing_onnx_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(tmp_path, _model([]))
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(MissingDependency, match=r"pip install 'uaii-loaders\[onnx\]'"):
        open_onnx(path)


def test_work_is_linear_in_the_file(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", [f"a{i}", f"w{i}"], [f"a{i + 1}"], name=f"n{i}") for i in range(300)]
    inits = [numpy_helper.from_array(np.full(20, i, np.float32), f"w{i}") for i in range(300)]
    path = _save(tmp_path, _model(inits, nodes=nodes))
    work = WorkCounter()
    open_onnx(path, work=work)
    assert 300 * 4 < work.steps < path.stat().st_size // 2
    with pytest.raises(WorkLimitExceeded):
        open_onnx(path, work=WorkCounter(limit=work.steps // 2))


# --- the dtype table ------------------------------------------------------------------------------------------


def test_the_dtype_table_matches_onnx() -> None:
    names = dict(TensorProto.DataType.items())
    assert {t.name.upper(): code for code, t in dtypes.TABLE.items()} == {n: c for n, c in names.items()}
    for code, t in dtypes.TABLE.items():
        if t.supported:
            assert onnx.helper.tensor_dtype_to_field(code) == onnx.TensorProto.DESCRIPTOR.fields_by_number[
                t.field].name
            if t.dtype is not None and not t.packed:
                assert dtypes.to_onnx(t.dtype) == code
                assert np.dtype(t.numpy) == t.dtype.numpy
    with pytest.raises(ValueError, match="q4_0"):
        dtypes.to_onnx(DType.Q4_0)


def test_onnx_file_is_frozen(tmp_path: Path) -> None:
    f = open_onnx(_save(tmp_path, _model([numpy_helper.from_array(np.ones(3, np.float32), "w")])))
    assert isinstance(f, OnnxFile)
    with pytest.raises(AttributeError):
        f.path = Path("/")  # type: ignore[misc]
    with pytest.raises(TypeError):
        f.inline["x"] = np.zeros(1)  # type: ignore[index]
