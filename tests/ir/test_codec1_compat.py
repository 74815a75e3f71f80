"""Codec 1, the C++ runtime's binary: files built here from the documented layout read with the same meaning
as their JSON twins; malformed records fail with the offset of the field."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.ir import FormatError, Graph
from uaii.ir.serialize import from_bytes, load, loads_json

REPO = Path(__file__).resolve().parents[2]
COMPAT = Path(os.environ.get("UAII_COMPAT_DIR", REPO.parent / "shared" / "compat" / "cpp-uaii-ir"))


import serialize_support as S  # noqa: E402  (tests/ir is on pytest's pythonpath)


def error_of(data: bytes) -> FormatError:
    with pytest.raises(FormatError) as e:
        from_bytes(data, path="m.uaii")
    assert e.value.offset is not None and 0 <= e.value.offset <= len(data)
    return e.value


@settings(max_examples=150, deadline=None)
@given(S.graphs(codec1=True), st.integers(1, 1 << 40), st.sampled_from(["reversed", "sorted"]))
def test_codec1_reads_like_its_json_twin(g: Graph, first_id: int, meta_order: str) -> None:
    from_binary = from_bytes(S.write_codec1(g, first_id=first_id, meta_order=meta_order))
    from_json = loads_json(S.cpp_style_json(g, first_id=first_id))
    assert S.graph_key(from_binary) == S.graph_key(from_json) == S.graph_key(g)


def test_toy_mlp_layout() -> None:
    g = S.toy_mlp()
    data = S.write_codec1(g)
    assert data[:16] == b"UAIR" + struct.pack("<III", 1, 1, 0)
    assert S.graph_key(from_bytes(data)) == S.graph_key(g)


def _tensor_record_offset(data: bytes) -> int:
    """Offset of the first tensor record of a codec-1 file (after the three graph strings and the count)."""
    pos = 16
    for _ in range(3):
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    return pos + 4


def test_record_errors_point_at_the_field() -> None:
    data = S.write_codec1(S.toy_mlp())
    t0 = _tensor_record_offset(data)
    dtype_at = t0 + 8 + 4 + 1  # id, name "x"
    for code, message in ((0, "dtype code 0"), (10, "dtype code 10")):
        bad = bytearray(data)
        bad[dtype_at] = code
        e = error_of(bytes(bad))
        assert message in str(e) and e.offset == dtype_at
    hint_at = dtype_at + 1 + 4 + 2 * 8
    bad = bytearray(data)
    bad[hint_at] = 4
    assert error_of(bytes(bad)).offset == hint_at
    bad[hint_at], bad[hint_at + 1] = 1, 2
    assert "is_weight byte is 2" in str(error_of(bytes(bad)))


def test_dangling_id_names_path_and_offset() -> None:
    g = S.toy_mlp()
    data = bytearray(S.write_codec1(g))
    ids = struct.pack("<IQQ", 2, 1, 2)  # fc1's inputs: x (1), w1 (2)
    at = data.index(ids)
    struct.pack_into("<Q", data, at + 12, 99)
    e = error_of(bytes(data))
    assert "$.nodes[0].inputs[1]" in str(e) and "tensor id 99" in str(e)
    assert e.offset == at + 12


def test_trailing_bytes_and_duplicate_metadata() -> None:
    data = S.write_codec1(S.toy_mlp())
    assert "trailing" in str(error_of(data + b"\x00"))
    g = S.toy_mlp()
    dup = S.write_codec1(Graph(g.name, g.inputs, g.outputs, g.nodes, g.tensors,
                               metadata=(("k", "a"), ("k", "b")), ir_version=(1, 0)))
    assert "appears twice" in str(error_of(dup))


def test_attribute_codes() -> None:
    data = bytearray(S.write_codec1(S.toy_mlp()))
    at = data.index(struct.pack("<I", 4) + b"axis") + 8
    assert data[at] == 1  # int
    data[at] = 6
    e = error_of(bytes(data))
    assert "type code 6" in str(e) and e.offset == at
    data = bytearray(S.write_codec1(S.toy_mlp()))
    at = data.index(struct.pack("<I", 11) + b"transpose_b") + 15
    data[at + 1] = 2
    assert "expected 0 or 1" in str(error_of(bytes(data)))


# --- the C++ runtime's own files, when this checkout sits next to them (never copied into the repo) --------
@pytest.mark.skipif(not COMPAT.is_dir(), reason=f"no C++ sample files at {COMPAT}")
@pytest.mark.parametrize("stem", ["toy_mlp", "tiny_demo_gguf"])
def test_cpp_sample_files_have_the_same_meaning(stem: str) -> None:
    from_json = load(COMPAT / f"{stem}.uaii.json")
    from_binary = load(COMPAT / f"{stem}.uaii")
    assert S.graph_key(from_json) == S.graph_key(from_binary)
    assert from_json.ir_version == (1, 0)
    if (COMPAT / f"{stem}.canonical.uaii.json").exists():
        assert S.graph_key(load(COMPAT / f"{stem}.canonical.uaii.json")) == S.graph_key(from_json)
