"""Mutation fuzzing of the GGUF, safetensors and PyTorch checkpoint readers.

Small valid files are mutated (bit flips, extreme counts and lengths written over header fields, truncation,
insertion, deletion, JSON-aware edits of safetensors headers). Every case must either parse into tensors that
lie inside the file, or fail with a FormatError naming the file: never another exception, a MemoryError or a
hang. safetensors cases are also checked against the reference implementation (the `safetensors` package):
whatever it rejects, we reject.

UAII_FUZZ_CASES (default 10000 per format) and UAII_FUZZ_SEED scale and vary the run; see docs/loaders.md.
"""

from __future__ import annotations

import io
import json
import os
import random
import resource
import struct
import time
import tracemalloc
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import FormatError, tensor_nbytes
from uaii.loaders.gguf import parse_bytes, parse_file
from uaii.loaders.safetensors import parse_header

CASES = int(os.environ.get("UAII_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("UAII_FUZZ_SEED", "1234"))
SLOW_CASE_S = 0.5  # a case that takes this long is a hang in the making
PEAK_BYTES = 16 << 20
"""Bound on one torch fuzz case's allocations: the files are a few KB, so anything near this was sized by a claim."""

U64 = [0, 1, 7, 8, 31, 32, 255, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 62, 1 << 63, (1 << 64) - 1]
U32 = [0, 1, 2, 8, 9, 12, 13, 30, 31, 39, 40, 99, 250, (1 << 31), (1 << 32) - 1]


def _mutate_bytes(rng: random.Random, data: bytes, hot: int) -> bytes:
    """One to three mutations, mostly inside the first ``hot`` bytes (the header)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        span = hot if rng.random() < 0.85 else len(buf)
        pos = rng.randrange(max(1, min(span, len(buf))))
        kind = rng.randrange(7)
        if kind == 0:
            buf[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            near_size = (len(buf) + rng.randint(-64, 64)) & (2**64 - 1)
            buf[pos:pos + 8] = struct.pack("<Q", rng.choice([*U64, near_size]))
        elif kind == 2:
            buf[pos:pos + 4] = struct.pack("<I", rng.choice(U32))
        elif kind == 3:
            del buf[rng.randrange(len(buf) + 1):]
        elif kind == 4:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 5:
            del buf[pos:pos + rng.randint(1, 16)]
        else:
            buf[pos] = rng.randrange(256)
        if not buf:
            break
    return bytes(buf)


def _run(cases: int, make: Callable[[int], bytes], parse: Callable[[bytes], object],
         check: Callable[[object, bytes], None], peak_bytes: int = 0) -> Counter[str]:
    """``peak_bytes``: when set, every case's peak of Python (and numpy) allocations is traced and bounded by it, and
    the process's peak RSS may not grow by more than 4 x it over the run (a parser that sizes an allocation by a
    claim in the file, or leaks per case, fails here)."""
    stats: Counter[str] = Counter()
    slowest, peak = 0.0, 0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if peak_bytes:
        tracemalloc.start()
    try:
        for i in range(cases):
            data = make(i)
            if peak_bytes:
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
            t0 = time.perf_counter()
            try:
                parsed = parse(data)
            except FormatError as exc:
                assert exc.path is not None, exc
                stats["rejected"] += 1
            else:
                check(parsed, data)
                stats["accepted"] += 1
            slowest = max(slowest, time.perf_counter() - t0)
            if peak_bytes:
                peak = max(peak, tracemalloc.get_traced_memory()[1] - base)
    finally:
        if peak_bytes:
            tracemalloc.stop()
    assert slowest < SLOW_CASE_S, f"slowest case took {slowest:.3f} s"
    stats["slowest_us"] = int(slowest * 1e6)
    if peak_bytes:
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
        assert peak <= peak_bytes, f"a case allocated {peak} bytes at its peak (bound {peak_bytes})"
        assert grown <= 4 * peak_bytes, f"peak RSS grew by {grown} bytes over the run"
        stats["peak_alloc_kib"] = peak // 1024
    return stats


def test_gguf_fuzz(tmp_path: Path) -> None:
    bases = []
    for i, kw in enumerate([{}, {"alignment": 64}]):
        p = tmp_path / f"base{i}.gguf"
        H.small_gguf(p, **kw)
        data = p.read_bytes()
        parsed = parse_bytes(data)
        bases.append((data, min(t.offset for t in parsed.tensors.values())))
    rng = random.Random(SEED)

    def make(i: int) -> bytes:
        data, hot = bases[i % len(bases)]
        return _mutate_bytes(rng, data, hot)

    def check(parsed: object, data: bytes) -> None:
        for t in parsed.tensors.values():  # type: ignore[attr-defined]
            assert t.offset >= 0 and t.offset + t.nbytes <= len(data)
        H.assert_gguf_table_sound(parsed, data)  # sizes from type x shape, tiling the data up to zero padding

    stats = _run(CASES, make, lambda d: parse_bytes(d, "fuzz.gguf"), check)
    print(f"\ngguf fuzz: {CASES} cases, {dict(stats)}")
    assert stats["rejected"] > CASES // 4 and stats["accepted"] > 0
    # the file path (mmap) behaves the same on a sample
    f = tmp_path / "case.gguf"
    for _ in range(200):
        f.write_bytes(make(0))
        try:
            parse_file(f)
        except FormatError as exc:
            assert exc.path == str(f.resolve())


def _st_base() -> bytes:
    rng = np.random.default_rng(0)
    return H.safetensors_bytes({"a": rng.standard_normal((2, 3), dtype=np.float32),
                                "b": np.arange(4, dtype=np.int64),
                                "c": ("BF16", [3], b"\x01\x02" * 3),
                                "e": np.zeros((0, 2), dtype=np.float16)}, {"format": "pt"})


_JUNK: list[object] = [-1, 0, 1, 2**31, 2**64, 2**70, 1.5, "x", None, [], {}, [1, 2, 3], True]


def _mutate_json(rng: random.Random, data: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    name = rng.choice([k for k in header if k != "__metadata__"])
    entry = header[name]
    kind = rng.randrange(8)
    if kind == 0:
        entry["dtype"] = rng.choice(["F32", "F16", "BF16", "I64", "U8", "F8_E4M3", "F33", "f32", 7])
    elif kind == 1:
        entry["shape"] = rng.choice([[rng.choice(_JUNK)], [2, 3, 4], [], [2**40, 2**40], "2,3"])
    elif kind == 2:
        i = rng.randrange(2)
        entry["data_offsets"][i] = rng.choice([*_JUNK, entry["data_offsets"][i] + rng.randint(-8, 8)])

    elif kind == 3:
        del entry[rng.choice(list(entry))]
    elif kind == 4:
        entry[rng.choice(["extra", "dtype"])] = rng.choice(_JUNK)
    elif kind == 5:
        header["__metadata__"] = rng.choice([{"k": 1}, "s", [], {"k": "v"}, None])
    elif kind == 6:
        header[rng.choice(["z", name])] = dict(entry)
    else:
        header = rng.choice([[], "s", 3, {"a": "[" * 5000}])  # type: ignore[assignment]
    text = json.dumps(header).encode()
    if kind == 6 and rng.random() < 0.5:  # a textual duplicate key
        text = text[:-1] + b', "' + name.encode() + b'": ' + json.dumps(entry).encode() + b"}"
    if rng.random() < 0.2:
        text = b" " + text if rng.random() < 0.5 else text[: rng.randrange(len(text) + 1)]
    return struct.pack("<Q", len(text)) + text + body


def _reference_accepts(path: Path) -> bool | None:
    try:
        import safetensors
    except ImportError:
        return None
    try:
        with safetensors.safe_open(str(path), framework="np") as f:
            list(f.keys())
        return True
    except Exception:
        return False


# Rules we add on top of the reference: no duplicate names, only dtypes UAII computes with, and the header's
# first byte is '{' (the reference tolerates leading whitespace).
_STRICTER = ("duplicate key", "which UAII does not support", "must start with '{'")



def test_safetensors_fuzz(tmp_path: Path) -> None:
    base = _st_base()
    (n,) = struct.unpack_from("<Q", base)
    rng = random.Random(SEED)
    cases: list[bytes] = []

    def make(i: int) -> bytes:
        data = _mutate_json(rng, base) if i % 2 else _mutate_bytes(rng, base, 8 + n)
        cases.append(data)
        return data

    def check(parsed: object, data: bytes) -> None:
        pos = 8 + parsed.header_size  # type: ignore[attr-defined]
        for t in sorted(parsed.tensors.values(), key=lambda t: t.offset):  # type: ignore[attr-defined]
            assert t.offset == pos and t.nbytes == tensor_nbytes(t.dtype, t.shape)
            pos = t.end
        assert pos == len(data)

    def parse(data: bytes) -> object:
        return parse_header(data, len(data), "fuzz.safetensors")

    stats = _run(CASES, make, parse, check)
    print(f"\nsafetensors fuzz: {CASES} cases, {dict(stats)}")
    assert stats["rejected"] > CASES // 4 and stats["accepted"] > 0
    # differential check against the reference implementation
    f = tmp_path / "case.safetensors"
    disagreements: Counter[str] = Counter()
    for data in cases[: min(len(cases), 4000)]:
        f.write_bytes(data)
        ref = _reference_accepts(f)
        if ref is None:
            pytest.skip("the safetensors package is not installed")
        try:
            parse(data)
            ours = True
        except FormatError as exc:
            ours = False
            if ref:
                assert any(s in str(exc) for s in _STRICTER), f"reference accepts, we reject: {exc}"
                disagreements["stricter"] += 1
        assert not (ours and not ref), f"the reference rejects a file we accept: {data[:200]!r}"
    print(f"safetensors vs reference: {dict(disagreements)} stricter rejections")


def _torch_bases(tmp_path: Path) -> list[bytes]:
    """A torch.save archive and a legacy-format file of a small state dict (f32, bf16, a tied and a view tensor)."""
    torch = pytest.importorskip("torch")
    w = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    sd = {"w": w, "tied": w, "rows": w[2:4], "bf": w.to(torch.bfloat16), "b": torch.ones(4)}
    out = []
    for zipped in (True, False):
        p = tmp_path / f"base{int(zipped)}.bin"
        torch.save(sd, p, _use_new_zipfile_serialization=zipped)
        out.append(p.read_bytes())
    return out


def test_torch_checkpoint_fuzz(tmp_path: Path) -> None:
    """torch.save archives and legacy files mutated (the pickle inside a zip is CRC-checked, so the zip cases mostly
    exercise the container), and bare pickles mutated through the pickle machine itself: FormatError or tensors
    inside the file, nothing else, no case slower than SLOW_CASE_S."""
    from uaii.loaders.torch_checkpoint import open_checkpoint
    from uaii.loaders.torch_pickle import load

    zipped, legacy = _torch_bases(tmp_path)
    with zipfile.ZipFile(io.BytesIO(zipped)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    rng = random.Random(SEED)
    case = tmp_path / "case.bin"

    def parse_file_bytes(data: bytes) -> object:
        case.write_bytes(data)
        return open_checkpoint(case)

    def inside(parsed: object, data: bytes) -> None:
        for t in parsed.tensors.values():  # type: ignore[attr-defined]
            assert t.offset >= 0 and t.end <= len(data) and t.nbytes == tensor_nbytes(t.dtype, t.shape)

    for name, base, hot in (("zip", zipped, len(zipped)), ("legacy", legacy, len(legacy))):
        stats = _run(CASES, lambda i, b=base, h=hot: _mutate_bytes(rng, b, h), parse_file_bytes, inside, PEAK_BYTES)
        print(f"\ntorch {name} fuzz: {CASES} cases, {dict(stats)}")
        assert stats["rejected"] > CASES // 4

    def parse_pickle(data: bytes) -> object:
        return load(data, "fuzz.pkl", 0, lambda pid, at: pid)

    stats = _run(CASES, lambda i: _mutate_bytes(rng, pkl, len(pkl)), parse_pickle, lambda parsed, data: None,
                 PEAK_BYTES)
    print(f"torch pickle fuzz: {CASES} cases, {dict(stats)}")
    assert stats["rejected"] > CASES // 4
