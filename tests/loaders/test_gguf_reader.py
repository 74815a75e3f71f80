"""GGUF reader: exact offsets, agreement with gguf.GGUFReader, v2/v3, alignment, split files, bad input."""

from __future__ import annotations

import struct
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import DType, FormatError
from uaii.loaders.gguf import cross_check, open_gguf, parse_file
from uaii.loaders.index import WeightIndex

gguf = pytest.importorskip("gguf")


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _raw(version: int = 3, n_tensors: int = 0, n_kv: int = 0, body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body


def _tensor_info(name: bytes, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return _string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + \
        struct.pack("<IQ", type_id, offset)


def _expect(path: Path, *fragments: str) -> FormatError:
    with pytest.raises(FormatError) as ei:
        open_gguf(path)
    msg = str(ei.value)
    assert msg.startswith("[gguf] "), msg
    assert str(path.resolve()) in msg, msg
    for f in fragments:
        assert f in msg, msg
    return ei.value


def test_offsets_and_bytes_match_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    H.small_gguf(path)
    g = open_gguf(path)
    assert g.version == 3 and g.alignment == 32 and g.architecture == "llama"
    assert g.metadata["llama.block_count"] == 1 and g.value_types["llama.block_count"] == "u32"
    assert g.metadata["tokenizer.ggml.tokens"][3] == "t3"
    assert g.metadata["general.flag"] is True
    assert np.allclose(g.metadata["tokenizer.ggml.scores"], 0.5)
    emb = g.tensors["token_embd.weight"]
    assert emb.dtype is DType.F32 and emb.shape == (16, 32) and emb.nbytes == 16 * 32 * 4
    up = g.tensors["blk.0.ffn_up.weight"]
    assert up.dtype is DType.Q8_0 and up.shape == (8, 64) and up.nbytes == 8 * 2 * 34
    assert all(t.offset % 32 == 0 for t in g.tensors.values())
    index = WeightIndex(tmp_path)
    ref = index.add(emb)
    assert str(ref) == "m.gguf#token_embd.weight"
    rng = np.random.default_rng(H.RNG_SEED)
    assert np.array_equal(index.read_numpy(ref), rng.standard_normal((16, 32), dtype=np.float32))
    assert cross_check(path) == []


def test_agrees_with_gguf_reader_and_custom_alignment(tmp_path: Path) -> None:
    path = tmp_path / "a.gguf"
    H.small_gguf(path, alignment=64)
    g = open_gguf(path)
    assert g.alignment == 64
    ref = gguf.GGUFReader(str(path))
    assert g.data_offsets[str(path.resolve())] == ref.data_offset
    for t in ref.tensors:
        mine = g.tensors[t.name]
        assert (mine.offset, mine.nbytes) == (t.data_offset, t.n_bytes)
        assert mine.offset % 64 == 0
    assert cross_check(path) == []


def test_version_2_is_read(tmp_path: Path) -> None:
    path = tmp_path / "v2.gguf"
    H.small_gguf(path)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    path.write_bytes(bytes(data))
    assert open_gguf(path).version == 2


def test_split_files_are_merged(tmp_path: Path) -> None:
    shards = H.small_gguf(tmp_path / "s.gguf", split_max_tensors=2)
    assert [p.name for p in shards] == ["s-00001-of-00002.gguf", "s-00002-of-00002.gguf"]
    g = open_gguf(shards[1])  # any shard names the model
    assert g.path == shards[0].resolve() and len(g.shards) == 2
    assert len(g.tensors) == 4 and g.architecture == "llama"
    assert {Path(t.file).name for t in g.tensors.values()} == {p.name for p in shards}
    whole = open_gguf(H.small_gguf(tmp_path / "whole.gguf")[0])
    index = WeightIndex(tmp_path)
    for name, t in g.tensors.items():
        assert index.read_bytes(index.add(t)) == index.read_bytes(index.add(whole.tensors[name]))
    shards[1].unlink()
    _expect(shards[0], "shard 2 of 2 is missing")


def test_unsupported_type_names_tensor_and_type(tmp_path: Path) -> None:
    path = tmp_path / "u.gguf"
    raw = np.zeros((4, 40), dtype=np.uint8)  # 4 rows of one Q8_1 block
    H.write_gguf(path, "llama", {}, {"w": (raw, gguf.GGMLQuantizationType.Q8_1)})
    g = open_gguf(path)
    assert g.tensors["w"].dtype is DType.Q8_1
    with pytest.raises(FormatError, match=r"tensor 'w' has type Q8_1, which the kernels do not support"):
        g.check_supported()


@pytest.mark.parametrize("case, fragments", [
    ("empty", ["empty file"]),
    ("magic", ["expected magic b'GGUF'"]),
    ("version", ["GGUF version 7 is not supported"]),
    ("big_endian", ["big-endian"]),
    ("truncated_header", ["tensor count needs 8 bytes"]),
    ("tensor_count", ["tensor count 9223372036854775808 cannot fit", "offset 0x8"]),
    ("kv_count", ["metadata count 18446744073709551615 cannot fit", "offset 0x10"]),
    ("huge_string", ["1099511627776 bytes", "only"]),
    ("huge_array", ["claims 4611686018427387904 items"]),
    ("nested_array", ["only arrays of scalars or strings"]),
    ("bad_value_type", ["unknown value type 99"]),
    ("duplicate_key", ["duplicate metadata key 'a'"]),
    ("bad_utf8_key", ["not valid UTF-8"]),
    ("alignment", ["general.alignment must be a power of two"]),
    ("too_many_dims", ["has 9 dimensions"]),
    ("unknown_type", ["unknown GGML type id 250"]),
    ("past_end", ["runs past the end of the file"]),
    ("misaligned", ["not a multiple of the alignment 32"]),
    ("block_size", ["not a multiple of the q8_0 block size 32"]),
    ("duplicate_tensor", ["duplicate tensor name 'x'"]),
    ("overlap", ["overlap"]),
    ("dim_overflow", ["runs past the end of the file"]),
])
def test_bad_files_fail_with_path_and_offset(tmp_path: Path, case: str, fragments: list[str]) -> None:
    kv_a = _string(b"a") + struct.pack("<IB", 0, 1)
    pad = b"\0" * 64
    t32 = _tensor_info(b"x", (8,), 0, 0)
    data = {
        "empty": b"",
        "magic": b"GGML" + b"\0" * 20,
        "version": _raw(7),
        "big_endian": b"GGUF" + struct.pack(">I", 3) + b"\0" * 16,
        "truncated_header": b"GGUF" + struct.pack("<I", 3) + b"\0\0",
        "tensor_count": _raw(3, 1 << 63, 0),
        "kv_count": _raw(3, 0, (1 << 64) - 1),
        "huge_string": _raw(3, 0, 1, _string(b"k") + struct.pack("<IQ", 8, 1 << 40) + pad),
        "huge_array": _raw(3, 0, 1, _string(b"k") + struct.pack("<IIQ", 9, 4, 1 << 62)),
        "nested_array": _raw(3, 0, 1, _string(b"k") + struct.pack("<IIQ", 9, 9, 1) + pad),
        "bad_value_type": _raw(3, 0, 1, _string(b"k") + struct.pack("<I", 99) + pad),
        "duplicate_key": _raw(3, 0, 2, kv_a + kv_a),
        "bad_utf8_key": _raw(3, 0, 1, _string(b"\xff\xfe") + struct.pack("<IB", 0, 1)),
        "alignment": _raw(3, 0, 1, _string(b"general.alignment") + struct.pack("<II", 4, 48)),
        "too_many_dims": _raw(3, 1, 0, _string(b"x") + struct.pack("<I", 9) + pad),
        "unknown_type": _raw(3, 1, 0, _tensor_info(b"x", (8,), 250, 0)),
        "past_end": _raw(3, 1, 0, _tensor_info(b"x", (1024,), 0, 0)) + pad,
        "misaligned": _raw(3, 1, 0, _tensor_info(b"x", (1,), 0, 4)) + pad,
        "block_size": _raw(3, 1, 0, _tensor_info(b"x", (16,), 8, 0)) + pad,
        "duplicate_tensor": _raw(3, 2, 0, t32 + t32) + pad,
        "overlap": _raw(3, 2, 0, _tensor_info(b"x", (16,), 0, 0) + _tensor_info(b"y", (8,), 0, 32)) + pad * 2,
        "dim_overflow": _raw(3, 1, 0, _tensor_info(b"x", (1 << 63, 1 << 63, 4), 0, 0)) + pad,
    }[case]
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    err = _expect(path, *fragments)
    if case not in ("empty",):
        assert err.offset is not None or "offset" in str(err)


def test_truncation_at_every_byte_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    H.small_gguf(path)
    data = path.read_bytes()
    g = open_gguf(path)
    data_start = min(t.offset for t in g.tensors.values())
    cut = tmp_path / "cut.gguf"
    for n in [*range(0, data_start, 7), data_start, len(data) - 1]:

        cut.write_bytes(data[:n])
        with pytest.raises(FormatError):
            parse_file(cut)


def test_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="cannot read"):
        open_gguf(tmp_path / "missing.gguf")
