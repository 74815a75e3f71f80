"""safetensors reader: offsets, sharded models, and the reference implementation's validation rules."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import DType, FormatError
from uaii.loaders.index import WeightIndex
from uaii.loaders.safetensors import open_file, open_safetensors


def _header_file(path: Path, header: object, data: bytes = b"", raw: bytes | None = None) -> Path:
    text = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def test_offsets_dtypes_and_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5), dtype=np.float32)
    b = rng.standard_normal(7).astype(np.float16)
    bf = np.arange(6, dtype=np.uint16)
    path = H.write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": b, "c": ("BF16", [2, 3], bf.tobytes()),
                                                            "ids": np.arange(4)}, {"format": "pt"})
    st = open_safetensors(path)
    assert st.metadata == {"format": "pt"}
    assert st.tensors["a"].dtype is DType.F32 and st.tensors["c"].dtype is DType.BF16
    assert st.tensors["ids"].dtype is DType.I64
    index = WeightIndex(tmp_path)
    assert np.array_equal(index.read_numpy(index.add(st.tensors["a"])), a)
    assert np.array_equal(index.read_numpy(index.add(st.tensors["b"])), b)
    assert np.array_equal(index.read_numpy(index.add(st.tensors["c"])), bf.reshape(2, 3))
    assert str(index.ref_for(st.tensors["a"])) == "m.safetensors#a"
    # the safetensors package, when present, reads the same values
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(path), framework="np") as f:
        assert np.array_equal(f.get_tensor("a"), a) and np.array_equal(f.get_tensor("ids"), np.arange(4))


def test_sharded_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    parts = {"x": rng.standard_normal(4, dtype=np.float32), "y": rng.standard_normal(3, dtype=np.float32)}
    H.write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"x": parts["x"]})
    H.write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"y": parts["y"]})
    index_json = {"metadata": {"total_size": 28}, "weight_map": {"x": "model-00001-of-00002.safetensors",
                                                                 "y": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index_json))
    st = open_safetensors(tmp_path)
    assert len(st.files) == 2 and set(st.tensors) == {"x", "y"}
    index = WeightIndex(tmp_path)
    for name, arr in parts.items():
        ref = index.add(st.tensors[name])
        assert str(ref).startswith("model-0000") and np.array_equal(index.read_numpy(ref), arr)
    # a shard outside the directory, a missing shard, a tensor in two shards
    for wmap, frag in [({"x": "../evil.safetensors"}, "plain file name"),
                       ({"x": "nope.safetensors"}, "does not exist"),
                       ({"y": "model-00001-of-00002.safetensors"}, "does not contain it")]:
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
        with pytest.raises(FormatError, match=frag):
            open_safetensors(tmp_path)
    H.write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"x": parts["x"]})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index_json))
    with pytest.raises(FormatError, match="appears in"):
        open_safetensors(tmp_path)


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize("case, fragment", [
    ("short", "8-byte header length"),
    ("huge_header", "exceeds the limit of 100000000"),
    ("header_past_end", "runs past the end of the file"),
    ("not_utf8", "not valid UTF-8"),
    ("not_brace", "must start with '{'"),
    ("bad_json", "not valid JSON"),
    ("not_object", "must start with '{'"),
    ("duplicate", "header names 'a' twice"),
    ("missing_key", "expected keys dtype, shape, data_offsets"),
    ("bad_dtype", "unknown dtype 'F33'"),
    ("unsupported_dtype", "dtype F8_E4M3, which UAII does not support"),
    ("negative_shape", "shape must be a list of non-negative integers"),
    ("reversed_offsets", "begin <= end"),
    ("size_mismatch", "needs 16"),
    ("gap", "leaves a gap"),
    ("overlap", "overlaps the previous tensor"),
    ("trailing", "but the file has"),
    ("past_end", "but the file has"),
    ("metadata", "__metadata__ must map strings to strings"),
    ("deep_json", "not valid JSON"),
])
def test_validation_rules(tmp_path: Path, case: str, fragment: str) -> None:
    p = tmp_path / f"{case}.safetensors"
    d16 = b"\0" * 16
    if case == "short":
        p.write_bytes(b"\x01\x02")
    elif case == "huge_header":
        p.write_bytes(struct.pack("<Q", 100_000_001) + b"{}")
    elif case == "header_past_end":
        p.write_bytes(struct.pack("<Q", 50) + b"{}")
    elif case == "not_utf8":
        _header_file(p, None, raw=b"{\xff}")
    elif case == "not_brace":
        _header_file(p, None, raw=b' {"a": 1}')
    elif case == "bad_json":
        _header_file(p, None, raw=b"{nope")
    elif case == "not_object":
        _header_file(p, None, raw=b"[1, 2]")
    elif case == "duplicate":
        _header_file(p, None, raw=b'{"a": ' + json.dumps(F32_4).encode() + b', "a": '
                     + json.dumps(F32_4).encode() + b"}", data=d16)
    elif case == "deep_json":
        _header_file(p, None, raw=b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}")
    else:
        header, data = {
            "missing_key": ({"a": {"dtype": "F32", "shape": [4]}}, d16),

            "bad_dtype": ({"a": {**F32_4, "dtype": "F33"}}, d16),
            "unsupported_dtype": ({"a": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4),
            "negative_shape": ({"a": {**F32_4, "shape": [-4]}}, d16),
            "reversed_offsets": ({"a": {**F32_4, "data_offsets": [16, 0]}}, d16),
            "size_mismatch": ({"a": {**F32_4, "data_offsets": [0, 12]}}, b"\0" * 12),
            "gap": ({"a": {**F32_4, "data_offsets": [4, 20]}}, b"\0" * 20),
            "overlap": ({"a": F32_4, "b": {**F32_4, "data_offsets": [8, 24]}}, b"\0" * 24),
            "trailing": ({"a": F32_4}, d16 + b"\0"),
            "past_end": ({"a": F32_4}, b"\0" * 8),
            "metadata": ({"__metadata__": {"k": 1}, "a": F32_4}, d16),
        }[case]
        _header_file(p, header, data)
    with pytest.raises(FormatError) as ei:
        open_file(p)
    msg = str(ei.value)
    assert msg.startswith("[safetensors] ") and str(p.resolve()) in msg, msg
    assert fragment in msg, msg


def test_empty_and_zero_sized_tensors(tmp_path: Path) -> None:
    p = _header_file(tmp_path / "e.safetensors", {})
    assert open_file(p).tensors == {}
    p = _header_file(tmp_path / "z.safetensors", {"z": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
                                                  "a": F32_4}, b"\0" * 16)
    t = open_file(p).tensors
    assert t["z"].nbytes == 0 and t["a"].nbytes == 16
