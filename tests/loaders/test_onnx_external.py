"""External data of ONNX models: sandboxed paths, checked ranges, and bounded memory beyond 2 GiB.

Every way a model can misname its external data (absolute paths, ``..``, symlinks leading out, missing files,
ranges past the end, lengths that disagree with dtype x shape) must fail with a FormatError naming the model,
the tensor, the location and what was wrong. A model whose weights are larger than protobuf's 2 GiB limit
(external data, and raw_data inside the .onnx itself) must open in bounded memory, with offsets exact enough
for the storage layer to read its last tensor back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.ir import FormatError
from uaii.loaders.index import WeightIndex
from uaii.loaders.onnx.proto import encode_varint
from uaii.loaders.onnx.reader import open_onnx
from uaii.storage import open_store

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _external(name: str, code: int, dims: list[int], location: str, offset: int | None = None,
              length: int | None = None, **extra: str) -> Any:
    t = TensorProto(name=name, data_type=code, dims=dims, data_location=TensorProto.EXTERNAL)
    entries = {"location": location, "offset": offset, "length": length, **extra}
    for k, v in entries.items():
        if v is not None:
            t.external_data.add(key=k, value=str(v))
    return t


def _model(initializers: list[Any], nodes: list[Any] | None = None) -> Any:
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    g = helper.make_graph(nodes or [], "main", [], out, initializers)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def _save(directory: Path, model: Any, name: str = "model.onnx") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(model.SerializeToString())
    return path


W = np.arange(24 * 40, dtype=np.float32).reshape(24, 40)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """model/ holds weights.bin (W at the unaligned offset 7), sub/w.bin, and links in and out; secret.bin lies
    outside it."""
    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "weights.bin").write_bytes(b"\xaa" * 7 + W.tobytes() + b"\xbb" * 5)
    (d / "sub" / "w.bin").write_bytes(W.tobytes())
    (tmp_path / "secret.bin").write_bytes(W.tobytes())
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "w.bin").write_bytes(W.tobytes())
    os.symlink(tmp_path / "secret.bin", d / "out_link.bin")
    os.symlink(tmp_path / "outside", d / "out_dir")
    os.symlink("sub/w.bin", d / "in_link.bin")
    os.symlink("loop.bin", d / "loop.bin")
    return d


def test_external_weights_point_into_their_file(model_dir: Path) -> None:
    t = _external("w", TensorProto.FLOAT, [24, 40], "weights.bin", 7, W.nbytes)
    f = open_onnx(_save(model_dir, _model([t])))
    info = f.weights["w"]
    assert (info.file, info.offset, info.nbytes, info.shape) == (os.path.realpath(model_dir / "weights.bin"), 7,
                                                                 W.nbytes, (24, 40))
    np.testing.assert_array_equal(f.value("w", limit=W.nbytes), W)
    assert f.model.graph.initializer[0].data_location == TensorProto.DEFAULT
    assert not f.model.graph.initializer[0].external_data


@pytest.mark.parametrize(("location", "offset", "length"), [
    ("sub/w.bin", None, None),  # no offset, no length: the whole file
    ("in_link.bin", 0, W.nbytes),  # a symlink that stays inside
    ("./sub/w.bin", None, W.nbytes),
])
def test_accepted_locations(model_dir: Path, location: str, offset: int | None, length: int | None) -> None:
    t = _external("w", TensorProto.FLOAT, [24, 40], location, offset, length, checksum="not-checked",
                  future_key="ignored")
    f = open_onnx(_save(model_dir, _model([t])))
    assert f.weights["w"].file == os.path.realpath(model_dir / "sub" / "w.bin")
    np.testing.assert_array_equal(f.value("w", limit=1 << 20), W)


@pytest.mark.parametrize(("location", "offset", "length", "message"), [
    ("/etc/passwd", None, None, "location is an absolute path"),
    ("C:\\weights.bin", None, None, "location is an absolute path"),
    ("\\\\server\\share", None, None, "location is an absolute path"),
    ("../secret.bin", None, None, "'..' component"),
    ("sub/../../secret.bin", None, None, "'..' component"),
    ("sub\\..\\..\\secret.bin", None, None, "'..' component"),
    ("out_link.bin", None, None, "outside the model directory .* symbolic link leads out"),
    ("out_dir/w.bin", None, None, "outside the model directory"),
    ("weights.bin\x00.txt", None, None, "NUL byte"),
    ("", None, None, "location is empty"),
    (".", None, None, "outside the model directory|not a regular file"),
    ("sub", None, None, "is not a regular file"),
    ("missing.bin", None, None, "cannot open .*missing.bin: No such file"),
    ("loop.bin", None, None, "cannot open|outside"),
    ("weights.bin", 7, W.nbytes + 4, f"length is {W.nbytes + 4} bytes, but a float tensor of shape \\[24, 40\\] "
     f"needs {W.nbytes}"),
    ("weights.bin", 7, None, f"no length is given, so the data runs from offset 7 to the end .*: {W.nbytes + 5} "
     "bytes"),
    ("weights.bin", 100, W.nbytes, "runs past the end of"),
    ("weights.bin", 1 << 40, W.nbytes, "offset 1099511627776 is past the end"),
])
def test_refused_locations_and_ranges(model_dir: Path, location: str, offset: int | None, length: int | None,
                                      message: str) -> None:
    t = _external("w", TensorProto.FLOAT, [24, 40], location, offset, length)
    path = _save(model_dir, _model([t]))
    with pytest.raises(FormatError, match=message) as err:
        open_onnx(path)
    text = str(err.value)
    assert err.value.path == str(path) and "initializer 'w'" in text and f"location {location!r}" in text
    assert err.value.offset is not None


@pytest.mark.parametrize(("entries", "message"), [
    ({"location": "weights.bin", "offset": "-1"}, "offset is '-1', expected a non-negative decimal integer"),
    ({"location": "weights.bin", "length": "1e3"}, "length is '1e3'"),
    ({"location": "weights.bin", "offset": "1" * 30}, "expected a non-negative decimal integer"),
    ({"offset": "0"}, "external_data has no 'location'"),
])
def test_malformed_external_data_entries(model_dir: Path, entries: dict[str, str], message: str) -> None:
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[24, 40], data_location=TensorProto.EXTERNAL)
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    with pytest.raises(FormatError, match=message):
        open_onnx(_save(model_dir, _model([t])))
    t.external_data.add(key="location", value="sub/w.bin")
    t.external_data.add(key="location", value="sub/w.bin")
    with pytest.raises(FormatError, match="gives 'location' twice"):
        open_onnx(_save(model_dir, _model([t])))


def test_external_data_beside_data_in_the_file_is_refused(model_dir: Path) -> None:
    t = _external("w", TensorProto.FLOAT, [24, 40], "sub/w.bin")
    t.raw_data = W.tobytes()
    with pytest.raises(FormatError, match="data_location is EXTERNAL but the tensor also holds data"):
        open_onnx(_save(model_dir, _model([t])))


def test_small_external_tensors_are_read_inline(model_dir: Path) -> None:
    (model_dir / "tiny.bin").write_bytes(b"\x01" + np.array([3, -4], np.int64).tobytes())
    t = _external("shape", TensorProto.INT64, [2], "tiny.bin", 1, 16)
    f = open_onnx(_save(model_dir, _model([t])))
    assert "shape" not in f.weights
    np.testing.assert_array_equal(f.inline["shape"], [3, -4])


def test_constant_tensors_saved_as_external_data_are_read_into_the_model(model_dir: Path) -> None:
    value = _external("v", TensorProto.FLOAT, [24, 40], "weights.bin", 7, W.nbytes)
    node = helper.make_node("Constant", [], ["y"], value=value, name="c")
    f = open_onnx(_save(model_dir, _model([], [node])))
    t = f.model.graph.node[0].attribute[0].t
    assert t.data_location == TensorProto.DEFAULT and not t.external_data
    np.testing.assert_array_equal(numpy_helper.to_array(t), W)
    outside = _external("v", TensorProto.FLOAT, [24, 40], "out_link.bin")
    node = helper.make_node("Constant", [], ["y"], value=outside, name="c")
    with pytest.raises(FormatError, match=r"attribute 'value' of node 'c' \(Constant\).*outside the model"):
        open_onnx(_save(model_dir, _model([], [node])))


def test_onnx_save_with_external_data_round_trips(tmp_path: Path) -> None:
    """What onnx.save writes (one shared file; its offsets, and the same shifted to odd ones) reads back exactly
    through the storage layer."""
    rng = np.random.default_rng(5)
    arrays = {f"w{i}": rng.standard_normal((i + 3, 17)).astype(np.float32) for i in range(5)}
    for align in (False, True):
        d = tmp_path / f"align{align}"
        d.mkdir()
        model = _model([numpy_helper.from_array(a, n) for n, a in arrays.items()])
        onnx.save_model(model, str(d / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="m.onnx_data", size_threshold=0, convert_attribute=False)
        if not align:  # onnx aligns to 4 KiB pages; shift everything by 3 bytes to make offsets odd
            _shift_external(d / "m.onnx", d / "m.onnx_data", 3)
        f = open_onnx(d / "m.onnx")
        index = WeightIndex(d, {})
        refs = {n: index.add(f.weights[n]) for n in arrays}
        with open_store(index) as store:
            for n, a in arrays.items():
                np.testing.assert_array_equal(store.acquire(refs[n]), a)
                assert (f.weights[n].offset % 2 == 1) == (not align)


def _shift_external(model_path: Path, data_path: Path, by: int) -> None:
    m = onnx.load(str(model_path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "offset":
                e.value = str(int(e.value) + by)
    model_path.write_bytes(m.SerializeToString())
    data_path.write_bytes(b"\x00" * by + data_path.read_bytes())


# --- beyond 2 GiB -----------------------------------------------------------------------------------------------

GIB = 1 << 30
TAIL = np.arange(20, dtype=np.float32) + 0.5  # 80 bytes: a weight, not inline

_PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from uaii.loaders.index import WeightIndex
    from uaii.loaders.onnx.reader import open_onnx
    from uaii.storage import open_store
    import onnx  # imported before the baseline: its import is not the loader's memory

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

    def hwm():
        return status("VmHWM")

    try:  # reset the peak to the current RSS (Linux >= 4.0), so the imports' own peak cannot hide ours
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    base = status("VmRSS")
    f = open_onnx(sys.argv[1])
    opened = hwm()
    index = WeightIndex(f.path.parent, {})
    refs = {name: index.add(info) for name, info in f.weights.items()}
    with open_store(index) as store:
        tail = store.acquire(refs["tail"]).tolist()
        big = store.acquire(refs["big"])
        edges = [float(big.reshape(-1)[0]), float(big.reshape(-1)[-1])]
    try:
        f.value("big")
        refused = False
    except Exception as exc:
        refused = type(exc).__name__ == "FormatError"
    print(json.dumps({"growth": opened - base, "after": hwm() - base, "tail": tail, "edges": edges,
                      "refused": refused, "model_bytes": f.model.ByteSize(),
                      "weights": {n: [i.file, i.offset, i.nbytes] for n, i in f.weights.items()}}))
""")


def _probe(path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_external_data_beyond_2gib_opens_in_bounded_memory(tmp_path: Path) -> None:
    """Weights in a sparse 2.25 GiB file at unaligned offsets: the open costs no weight memory, offsets are exact."""
    rows = 576  # [576, 2^20] f32 = 2.25 GiB in one tensor, past protobuf's (and int32's) limit
    big_at, big_n = 3, rows * (1 << 20) * 4
    mid_at = big_at + big_n + 5
    tail_at = mid_at + 1024 * 4 + 1
    data = tmp_path / "weights.bin"
    with open(data, "wb") as fh:
        fh.truncate(tail_at + TAIL.nbytes + 9)
        fh.seek(big_at)
        fh.write(np.float32(1.25).tobytes())
        fh.seek(big_at + big_n - 4)
        fh.write(np.float32(-2.5).tobytes())
        fh.seek(tail_at)
        fh.write(TAIL.tobytes())
    inits = [_external("big", TensorProto.FLOAT, [rows, 1 << 20], "weights.bin", big_at, big_n),
             _external("mid", TensorProto.FLOAT, [1024], "weights.bin", mid_at, 4096),
             _external("tail", TensorProto.FLOAT, [20], "weights.bin", tail_at, TAIL.nbytes)]
    nodes = [helper.make_node("Gather", ["big", "idx"], ["y"], name="gather")]
    path = _save(tmp_path, _model(inits, nodes))
    assert os.stat(data).st_blocks * 512 < 64 << 20  # the file really is sparse: this test costs no disk
    r = _probe(path)
    assert r["weights"]["big"] == [str(data), big_at, big_n]
    assert r["weights"]["mid"] == [str(data), mid_at, 4096]
    assert r["tail"] == TAIL.tolist() and r["edges"] == [1.25, -2.5]
    assert r["refused"] and r["model_bytes"] < 4096
    assert r["growth"] < 200 << 20 and r["after"] < 200 << 20, r


def test_inline_raw_data_beyond_2gib_opens_in_bounded_memory(tmp_path: Path) -> None:
    """A .onnx of 2.25 GiB (raw_data inside it: protobuf parsers refuse it) opens, and its offsets are exact."""
    rows = 576
    big_n = rows * (1 << 20) * 4
    big_head = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[rows, 1 << 20]).SerializeToString()
    big_head += encode_varint(9 << 3 | 2) + encode_varint(big_n)  # raw_data, whose bytes follow as a hole
    tail = numpy_helper.from_array(TAIL, "tail").SerializeToString()
    graph_rest = _model([]).graph.SerializeToString()
    init_field = encode_varint(5 << 3 | 2) + encode_varint(len(big_head) + big_n)
    tail_field = encode_varint(5 << 3 | 2) + encode_varint(len(tail)) + tail
    graph_len = len(graph_rest) + len(init_field) + len(big_head) + big_n + len(tail_field)
    shell = _model([])
    shell.ClearField("graph")
    head = shell.SerializeToString() + encode_varint(7 << 3 | 2) + encode_varint(graph_len) + graph_rest
    path = tmp_path / "big.onnx"
    with open(path, "wb") as fh:
        fh.write(head + init_field + big_head)
        raw_at = fh.tell()
        fh.write(np.float32(1.25).tobytes())
        fh.seek(raw_at + big_n - 4)
        fh.write(np.float32(-2.5).tobytes())
        fh.write(tail_field)
    assert path.stat().st_size > 2 * GIB
    r = _probe(path)
    assert r["weights"]["big"] == [str(path), raw_at, big_n]
    assert r["tail"] == TAIL.tolist() and r["edges"] == [1.25, -2.5]
    assert r["refused"]
    assert r["growth"] < 200 << 20 and r["after"] < 200 << 20, r
