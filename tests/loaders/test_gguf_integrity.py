"""GGUF has no checksums: the tensor table is checked against the data it describes, the metadata's counts
against the tensors, before anything is built from them (issue 11, points 3 and 6).

Corruptions are made by editing header bytes of files written with gguf's GGUFWriter (and of sparse copies of
the real models: header bytes copied, tensor data a hole of zeros, which no check reads).
"""

from __future__ import annotations

import os
import re
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uaii.ir import FormatError
from uaii.loaders import LoaderError, from_gguf, load_model, open_gguf
from uaii.loaders.gguf import parse_bytes, parse_file

gguf = pytest.importorskip("gguf")

Q4_0, Q4_1 = 2, 3  # GGML type ids
VOCAB, D, FF = 48, 32, 64
KV: dict[str, Any] = {
    "llama.block_count": 2, "llama.embedding_length": D, "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2, "llama.feed_forward_length": FF, "llama.context_length": 64,
    "tokenizer.ggml.tokens": [f"t{i}" for i in range(VOCAB)]}
SHAPES = [("attn_q", (32, 32)), ("attn_k", (16, 32)), ("attn_v", (16, 32)), ("attn_output", (32, 32)),
          ("ffn_gate", (FF, D)), ("ffn_up", (FF, D)), ("ffn_down", (D, FF))]


def tiny_tensors(n_layers: int = 2) -> dict[str, Any]:
    """A llama whose matrices are Q4_1 (20 bytes a block; every size a multiple of 32, so no padding)."""
    rng = np.random.default_rng(H.RNG_SEED)
    t: dict[str, Any] = {"token_embd.weight": rng.standard_normal((VOCAB, D), dtype=np.float32),
                         "output_norm.weight": np.ones(D, np.float32)}
    for i in range(n_layers):
        t[f"blk.{i}.attn_norm.weight"] = np.ones(D, np.float32)
        t[f"blk.{i}.ffn_norm.weight"] = np.ones(D, np.float32)
        for name, shape in SHAPES:
            t[f"blk.{i}.{name}.weight"] = H.quantize(rng.standard_normal(shape, dtype=np.float32), "Q4_1")
    return t


def tiny(path: Path, kv: dict[str, Any] | None = None, **write_kw: Any) -> list[Path]:
    return H.write_gguf(path, "llama", {**KV, **(kv or {})}, tiny_tensors(), **write_kw)


def record(data: bytes, name: str) -> dict[str, int]:
    """Byte positions of the fields of tensor ``name``'s info record: dims, type, offset."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.find(key)
    assert at > 0 and data.find(key, at + 1) < 0, name
    (n_dims,) = struct.unpack_from("<I", data, at + len(key))
    dims = at + len(key) + 4
    return {"start": at, "dims": dims, "type": dims + 8 * n_dims, "offset": dims + 8 * n_dims + 4,
            "end": dims + 8 * n_dims + 12}


def kv_value(data: bytes, key: str) -> int:
    """Byte position of a metadata key's value (after its u32 type)."""
    at = data.find(struct.pack("<Q", len(key)) + key.encode())
    assert at > 0, key
    return at + 8 + len(key) + 4


def patch(path: Path, pos: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack(fmt, value))


def head(path: Path) -> bytes:
    """Header bytes: the metadata and the tensor table (the data section starts after them)."""
    with open(path, "rb") as f:
        return f.read(parse_file(path).data_start)


def sparse_copy(src: Path, dst: Path) -> Path:
    """``src``'s header at the same file size, its tensor data a hole: no tensor data is read by the checks."""
    with open(dst, "wb") as f:
        f.write(head(src))
        f.truncate(src.stat().st_size)
    return dst


def expect_format_error(path: Path, *patterns: str) -> FormatError:
    with pytest.raises(FormatError) as ei:
        load_model(path)
    msg = str(ei.value)
    assert msg.startswith(f"[gguf] {path.resolve()}: ") and ei.value.offset is not None, msg
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not in {msg}"
    return ei.value


# --- the tensor table against the data (point 3) ------------------------------------------------------------
def test_a_type_flip_q4_1_to_q4_0_is_refused(tmp_path: Path) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    load_model(path)  # the file as written loads
    q = open_gguf(path).tensors["blk.0.attn_q.weight"]
    patch(path, record(head(path), q.name)["type"], "<I", Q4_0)  # 18 bytes a block instead of 20
    err = expect_format_error(
        path, rf"tensor 'blk\.0\.attn_q\.weight' \(type Q4_0, shape \[32, 32\]\) at offset {q.offset:#x} is 576 "
              r"bytes, but the next tensor, '[\w.]+', starts at 0x[0-9a-f]+ \(64 bytes after its end; more than "
              r"the 31 bytes of padding\): the declared type or shape does not match the data")
    assert err.offset == q.offset + 576


def test_a_type_flip_in_the_real_smollm2_is_refused(smollm2_path: Path, tmp_path: Path) -> None:
    path = sparse_copy(smollm2_path, tmp_path / "smollm2.gguf")
    assert load_model(path).config.n_layers == 30
    data = head(path)
    q = record(data, "blk.0.attn_q.weight")
    assert struct.unpack_from("<I", data, q["type"]) == (Q4_1,)
    patch(path, q["type"], "<I", Q4_0)
    expect_format_error(path, r"tensor 'blk\.0\.attn_q\.weight' \(type Q4_0, shape \[576, 576\]\) at offset 0x"
                              r"[0-9a-f]+ is 186624 bytes, but the next tensor.* \(20736 bytes after its end")


def test_a_shape_flip_is_refused(tmp_path: Path) -> None:
    """token_embd rows 48 -> 32 (bit 4): the table shrinks by 2 KiB; before, the model loaded with 32 ids."""
    path = tiny(tmp_path / "m.gguf")[0]
    rows_at = record(head(path), "token_embd.weight")["dims"] + 8  # dims are innermost first
    patch(path, rows_at, "<Q", VOCAB ^ 16)
    expect_format_error(path, r"tensor 'token_embd\.weight' \(type F32, shape \[32, 32\]\) .* is 4096 bytes, "
                              r"but the next tensor.* \(2048 bytes after its end")


def test_overlapping_tensors_are_refused(tmp_path: Path) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    g = open_gguf(path)
    k, q = g.tensors["blk.0.attn_k.weight"], g.tensors["blk.0.attn_q.weight"]
    data_start = g.data_offsets[str(path.resolve())]
    patch(path, record(head(path), k.name)["offset"], "<Q", q.offset - data_start + 32)
    expect_format_error(path, r"tensors '[\w.]+' and '[\w.]+' overlap: tensor .* is \d+ bytes and ends at 0x")


def test_a_tail_after_the_last_tensor_is_refused(tmp_path: Path) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    with open(path, "ab") as f:
        f.write(bytes(31))
    load_model(path)  # less than the alignment of zeros: padding, as the writers leave it
    with open(path, "ab") as f:
        f.write(b"\0")
    expect_format_error(path, r"but the file goes on for 32 more bytes \(size 0x[0-9a-f]+; more than the 31 "
                              r"bytes of padding\)")


def test_padding_must_be_zeros(tmp_path: Path) -> None:
    """One Q4_1 block (20 bytes, 12 of padding) read as Q4_0 (18): the gap is padding-sized but holds data."""
    rng = np.random.default_rng(0)
    path = H.write_gguf(tmp_path / "p.gguf", "llama", {}, {
        "a": H.quantize(rng.standard_normal((1, 32), dtype=np.float32), "Q4_1"), "b": np.ones(8, np.float32)})[0]
    open_gguf(path)
    patch(path, record(head(path), "a")["type"], "<I", Q4_0)
    with pytest.raises(FormatError, match=r"tensor 'a' \(type Q4_0, shape \[1, 32\]\) .* is 18 bytes, but the "
                                          r"next tensor, 'b', starts .* \(14 bytes after its end; padding is "
                                          r"zeros, these are not\)"):
        open_gguf(path)


def test_each_shard_of_a_split_model_is_checked(tmp_path: Path) -> None:
    shards = tiny(tmp_path / "s.gguf", split_max_tensors=8)
    assert len(shards) == 3
    load_model(shards[0])
    victim = shards[1]
    name = next(n for n, t in open_gguf(shards[0]).tensors.items()
                if Path(t.file) == victim.resolve() and t.dtype.value == "q4_1")
    patch(victim, record(head(victim), name)["type"], "<I", Q4_0)
    with pytest.raises(FormatError, match=rf"\[gguf\] {re.escape(str(victim.resolve()))}: tensor '{name}' "
                                          r"\(type Q4_0"):
        load_model(shards[0])


def test_a_split_count_that_disagrees_with_the_file_name_is_refused(tmp_path: Path) -> None:
    """Before, the count from the metadata sized the list of shard names (and named a shard that never was)."""
    shards = tiny(tmp_path / "s.gguf", split_max_tensors=8)
    at = kv_value(head(shards[0]), "split.count")
    patch(shards[0], at, "<H", 3 | (1 << 14))  # a u16, as both writers store it
    with pytest.raises(FormatError, match=r"s-00001-of-00003\.gguf: split\.count is 16387, but the file name says "
                                          r"3 shards"):
        load_model(shards[0])


def _check_change(data: bytes, pos: int, value: int) -> str:
    changed = data[:pos] + bytes([value]) + data[pos + 1:]
    try:
        parsed = parse_bytes(changed, "changed.gguf")
    except FormatError as exc:
        assert exc.path == "changed.gguf" and exc.offset is not None, exc
        return "refused"
    H.assert_gguf_table_sound(parsed, changed)
    return "accepted"


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, int, int]:
    """The tiny model's bytes and the span of its tensor-info records."""
    path = tiny(tmp_path_factory.mktemp("table") / "t.gguf")[0]
    data = path.read_bytes()
    spans = [record(data, name) for name in open_gguf(path).tensors]
    return data, min(s["start"] for s in spans), max(s["end"] for s in spans)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), value=st.integers(0, 255))
def test_any_byte_change_in_the_tensor_table_is_refused_or_harmless(table: tuple[bytes, int, int], where: float,
                                                                     value: int) -> None:
    data, start, end = table
    _check_change(data, start + int(where * (end - start)), value)


def test_every_bit_flip_in_the_tensor_table(table: tuple[bytes, int, int]) -> None:
    data, start, end = table
    outcomes = [_check_change(data, pos, data[pos] ^ (1 << bit)) for pos in range(start, end) for bit in range(8)]
    assert outcomes.count("refused") > len(outcomes) // 2  # names and equal-size types may change unnoticed


# --- counts in the metadata against the tensors (point 6) ---------------------------------------------------
def test_a_flipped_block_count_fails_fast_naming_key_value_and_tensors(tmp_path: Path) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    patch(path, kv_value(head(path), "llama.block_count"), "<I", 2 ^ (1 << 24))
    with pytest.raises(LoaderError, match=r"m\.gguf: llama\.block_count is 16777218, but the tensors hold layers "
                                          r"up to blk\.1 \(2 layers\)"):
        load_model(path)


def _load_cost(path: Path) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    with pytest.raises(LoaderError) as ei:
        load_model(path)
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    try:
        with pytest.raises(LoaderError):
            load_model(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return seconds, peak, str(ei.value)


def test_a_flipped_gemma3_block_count_costs_no_time_or_memory(gemma3_path: Path, tmp_path: Path) -> None:
    """Before: 18 -> 2^24 + 18 layers built per-layer tables for ~2 s and ~190 MB (2^26: 69 s, 600 MB)."""
    path = sparse_copy(gemma3_path, tmp_path / "gemma3.gguf")
    patch(path, kv_value(head(path), "gemma3.block_count"), "<I", 18 ^ (1 << 24))
    seconds, peak, msg = _load_cost(path)
    assert seconds < 1.0 and peak < 50 * 2**20, (seconds, peak)
    assert "gemma3.block_count is 16777234, but the tensors hold layers up to blk.17 (18 layers)" in msg


def test_an_expert_count_without_experts_fails_fast(tmp_path: Path) -> None:
    """Before: the builder looked for 2^24 per-expert tensors in layer 0, one name at a time (~8 s)."""
    path = tiny(tmp_path / "m.gguf", {"llama.expert_count": 1 << 24, "llama.expert_used_count": 2})[0]
    seconds, peak, msg = _load_cost(path)
    assert seconds < 1.0 and peak < 50 * 2**20, (seconds, peak)
    assert "llama.expert_count is 16777216, more than the 4096 that any model has" in msg
    patch(path, kv_value(head(path), "llama.expert_count"), "<I", 1 << 11)
    with pytest.raises(LoaderError, match=r"llama\.expert_count is 2048, but the file holds no expert tensors"):
        load_model(path)


@pytest.mark.parametrize("kv, message", [
    ({"llama.attention.head_count": 8}, r"blk\.0\.attn_k\.weight has shape \[16, 32\], but the metadata says 8 "
                                        r"rows: llama\.attention\.head_count_kv 2 x head size 4 \(llama\."
                                        r"embedding_length 32 / llama\.attention\.head_count 8\)"),
    ({"llama.attention.head_count_kv": 4}, r"blk\.0\.attn_k\.weight .* says 32 rows"),
    ({"llama.attention.key_length": 16}, r"blk\.0\.attn_q\.weight .* says 64 rows: llama\.attention\.head_count "
                                         r"4 x head size 16 \(llama\.attention\.key_length\)"),
    ({"llama.embedding_length": 48}, r"llama\.embedding_length is 48, but token_embd\.weight has shape \[48, 32\]"),
    ({"llama.vocab_size": 64}, r"llama\.vocab_size is 64, but token_embd\.weight has shape \[48, 32\]"),
    ({"llama.feed_forward_length": 96}, r"llama\.feed_forward_length is 96, but blk\.0\.ffn_down\.weight has "
                                        r"shape \[32, 64\]"),
    ({"tokenizer.ggml.tokens": [f"t{i}" for i in range(VOCAB + 1)]},
     r"tokenizer\.ggml\.tokens has 49 tokens, but token_embd\.weight has only 48 rows"),
    ({"llama.attention.head_count_kv": [2, 2, 2]},
     r"llama\.attention\.head_count_kv is an array of 3 entries, but llama\.block_count is 2"),
    ({"llama.context_length": 1 << 30}, r"llama\.context_length is 1073741824, more than the 16777216"),
    ({"llama.block_count": 3}, r"llama\.block_count is 3, but the tensors hold layers up to blk\.1"),
])
def test_counts_the_tensors_contradict(tmp_path: Path, kv: dict[str, Any], message: str) -> None:
    path = tiny(tmp_path / "m.gguf", kv)[0]
    with pytest.raises(LoaderError, match=r"\[loaders\] m\.gguf: " + message):
        load_model(path)


def test_a_missing_layer_is_named(tmp_path: Path) -> None:
    t = tiny_tensors(3)
    for name in [n for n in t if n.startswith("blk.1.")]:
        del t[name]
    path = H.write_gguf(tmp_path / "m.gguf", "llama", {**KV, "llama.block_count": 3}, t)[0]
    with pytest.raises(LoaderError, match=r"llama\.block_count is 3, but layers blk\.1 have no tensors"):
        load_model(path)


def gpt2_tensors(n_positions: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    t: dict[str, Any] = {"token_embd.weight": rng.standard_normal((VOCAB, D), dtype=np.float32),
                         "position_embd.weight": rng.standard_normal((n_positions, D), dtype=np.float32)}
    for norm in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        t[f"{norm}.weight"], t[f"{norm}.bias"] = np.ones(D, np.float32), np.zeros(D, np.float32)
    for name, rows, cols in (("attn_qkv", 3 * D, D), ("attn_output", D, D), ("ffn_up", FF, D), ("ffn_down", D, FF)):
        t[f"blk.0.{name}.weight"] = rng.standard_normal((rows, cols), dtype=np.float32)
        t[f"blk.0.{name}.bias"] = np.zeros(rows, np.float32)
    return t


def test_a_context_longer_than_the_position_table_is_refused(tmp_path: Path) -> None:
    kv = {"gpt2.block_count": 1, "gpt2.embedding_length": D, "gpt2.attention.head_count": 4,
          "gpt2.feed_forward_length": FF, "gpt2.context_length": 64, "gpt2.attention.layer_norm_epsilon": 1e-5}
    assert load_model(H.write_gguf(tmp_path / "ok.gguf", "gpt2", kv, gpt2_tensors(64))[0]).config.context_length == 64
    path = H.write_gguf(tmp_path / "long.gguf", "gpt2", {**kv, "gpt2.context_length": 128}, gpt2_tensors(64))[0]
    with pytest.raises(LoaderError, match=r"gpt2\.context_length is 128, but position_embd\.weight has shape "
                                          r"\[64, 32\]: one row per position"):
        load_model(path)


def test_from_gguf_bounds_counts_and_per_layer_arrays() -> None:
    """Metadata normalized without a tensor table (from_gguf alone) is bounded too."""
    base = {"general.architecture": "gemma3", "gemma3.block_count": 2, "gemma3.embedding_length": 64,
            "gemma3.attention.head_count": 4, "gemma3.attention.sliding_window": 8}
    assert from_gguf({**base, "gemma3.attention.sliding_window_pattern": np.array([True, False])}).sliding_layers \
        == (True, False)
    with pytest.raises(LoaderError, match=r"sliding_window_pattern has 3 entries for 2 layers"):
        from_gguf({**base, "gemma3.attention.sliding_window_pattern": np.array([True, True, False])})
    t0 = time.perf_counter()
    with pytest.raises(LoaderError, match=r"gemma3\.block_count is 1073741826, more than the 4096"):
        from_gguf({**base, "gemma3.block_count": 2 + (1 << 30)})
    assert time.perf_counter() - t0 < 0.5


def test_the_real_models_pass_every_check(smollm2_path: Path, gemma3_path: Path) -> None:
    """Files of both writers (llama.cpp's quantizer, gguf-py) pass, and these two have no padding at all."""
    from uaii.loaders.gguf_counts import check_counts

    for path in (smollm2_path, gemma3_path):
        g = open_gguf(path)
        check_counts(g.metadata, g.tensors, path.name)
        assert os.path.getsize(path) == max(t.end for t in g.tensors.values())
