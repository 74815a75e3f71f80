"""Mutation fuzzing of the ONNX file layer: only FormatError or a sound open, never a crash, hang or stray read.

Small valid models (built with onnx.helper: raw, typed, int4, external and sparse initializers, subgraphs,
Constant nodes) are mutated in memory — bit flips, byte overwrites, truncation, inserted varints, lying lengths,
deleted and duplicated spans — and external-data entries are made to lie (paths with ``..``, absolute paths,
symlinks out of the directory, offsets and lengths past the end or not numbers). Each case must either fail
with a FormatError naming a file, or open into weights that lie inside their files inside the sandbox and values
that read back. An audit hook records every file opened while a case runs: none may lie outside the model
directory. Work is capped per case by a deterministic counter (fields read, tensors placed, bytes scanned), not a
clock: a case that would loop or allocate without bound fails the cap instead of hanging the run.

UAII_ONNX_FUZZ_CASES (default 100000) and UAII_FUZZ_SEED scale and vary the slow run.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from uaii.ir import FormatError, tensor_nbytes
from uaii.loaders.onnx.proto import WorkCounter, encode_varint
from uaii.loaders.onnx.reader import open_onnx

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CASES = int(os.environ.get("UAII_ONNX_FUZZ_CASES", "100000"))
SEED = int(os.environ.get("UAII_FUZZ_SEED", "1234"))
VARINTS = [0, 1, 2, 7, 0x7F, 0x80, 255, 4096, 1 << 20, (1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 63) - 1,
           1 << 63, (1 << 64) - 1]
HOSTILE_LOCATIONS = ["../secret.bin", "/etc/passwd", "C:\\w.bin", "sub/../../secret.bin", "out_link.bin",
                     "out_dir/w.bin", "loop.bin", "", ".", "sub", "w.bin\x00", "missing.bin", "in_link.bin",
                     "w.bin", "sub/w.bin", "./w.bin", "\\\\host\\share\\w.bin"]

# --- the corpus ----------------------------------------------------------------------------------------------


def _graph(name: str, nodes: list[Any], inits: list[Any], **kw: Any) -> Any:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    return helper.make_graph(nodes, name, [x], [y], inits, **kw)


def _model(graph: Any) -> bytes:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                          producer_name="fuzz", doc_string="a small model")
    helper.set_model_props(m, {"k": "v"})
    data: bytes = m.SerializeToString()
    return data


def _ext(name: str, dims: list[int], offset: int, nbytes: int, location: str = "w.bin") -> Any:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        t.external_data.add(key=k, value=v)
    return t


def _corpus() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W")
    b = helper.make_tensor("b", TensorProto.FLOAT, [16], rng.standard_normal(16).astype(np.float32))
    shape = numpy_helper.from_array(np.array([-1, 16], np.int64), "shape")
    q = helper.make_tensor("q", TensorProto.INT4, [5, 7], rng.integers(-8, 8, 35), raw=True)
    q2 = helper.make_tensor("q2", TensorProto.UINT4, [3], [1, 2, 3])
    h = helper.make_tensor("h", TensorProto.BFLOAT16, [40], rng.standard_normal(40).astype(np.float32))
    flag = helper.make_tensor("flag", TensorProto.BOOL, [1], [True])
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(4, np.float32), "cv"))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"], name="reshape"), const]
    mlp = _graph("mlp", nodes, [w, b, shape, q, q2, h, flag],
                 value_info=[helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", 16])])

    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    then_g = helper.make_graph([helper.make_node("Identity", ["tw"], ["y"])], "then", [], out,
                               [numpy_helper.from_array(np.arange(20, dtype=np.float32), "tw")])
    else_g = helper.make_graph([helper.make_node("Identity", ["ew"], ["y"])], "else", [], out,
                               [helper.make_tensor("ew", TensorProto.INT64, [3], [1, -2, 3])])
    branch = _graph("branch", [helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)],
                    [flag])

    ext = _graph("ext", [helper.make_node("Constant", [], ["k"], value=_ext("kv", [4], 3, 16)),
                         helper.make_node("MatMul", ["x", "E"], ["y"])],
                 [_ext("E", [16, 16], 1, 1024), _ext("E2", [8], 1025, 32), _ext("E3", [40], 3, 160, "sub/w.bin")])

    values = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 5, 9], np.int64), "sp_i")
    sparse = _graph("sparse", [helper.make_node("Identity", ["x"], ["y"])], [b],
                    sparse_initializer=[helper.make_sparse_tensor(values, indices, [2, 5])])
    return {"mlp": _model(mlp), "branch": _model(branch), "ext": _model(ext), "sparse": _model(sparse)}


def _lying_external(rng: random.Random) -> bytes:
    """A model whose one external tensor names a hostile location, offset or length."""
    dims = rng.choice([[16, 16], [64], [0], [], [1 << 20, 1 << 20], [0, 1 << 62]])
    t = TensorProto(name="E", data_type=rng.choice([1, 7, 10, 22, 2, 9]), dims=dims,
                    data_location=TensorProto.EXTERNAL)
    number = [str(rng.choice([0, 1, 3, 1024, 1025, 1 << 40, 2**64])), "-1", "0x10", "", " 1", "1e3", "9" * 25]
    for key in ("location", "offset", "length", "checksum"):
        if rng.random() < 0.8:
            value = rng.choice(HOSTILE_LOCATIONS) if key == "location" else rng.choice(number)
            t.external_data.add(key=key, value=value)
    return _model(_graph("lying", [helper.make_node("Identity", ["x"], ["y"])], [t]))


def _mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(buf) + 1)
        kind = rng.randrange(8)
        if kind == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif kind == 2:
            del buf[pos:]
        elif kind == 3:
            buf[pos:pos] = encode_varint(rng.choice(VARINTS))
        elif kind == 4:  # a lying length: overwrite whatever is there with a large varint
            v = encode_varint(rng.choice(VARINTS))
            buf[pos:pos + len(v)] = v
        elif kind == 5:
            del buf[pos:pos + rng.randint(1, 16)]
        elif kind == 6 and buf:
            a = rng.randrange(len(buf))
            buf[pos:pos] = buf[a:a + rng.randint(1, 64)]
        else:  # splice a piece of another model
            other = rng.choice(corpus)
            a = rng.randrange(len(other))
            buf[pos:pos + rng.randint(0, 32)] = other[a:a + rng.randint(1, 64)]
        if not buf:
            break
    return bytes(buf)


# --- the sandbox and the checks ---------------------------------------------------------------------------------

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))


_HOOKED = False


@contextmanager
def _watch() -> Iterator[list[str]]:
    """Every path opened inside the block (Python's audit event "open": open(), os.open(), io.open())."""
    global _OPENED, _HOOKED
    if not _HOOKED:
        sys.addaudithook(_audit)  # cannot be removed; idle (one comparison) outside _watch
        _HOOKED = True
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def _make_sandbox(root: Path) -> Path:
    """root/model/ is the sandbox (w.bin, sub/w.bin, links in and out); root/secret.bin lies outside it."""
    d = root / "model"
    (d / "sub").mkdir(parents=True)
    payload = np.arange(2048, dtype=np.float32).tobytes()
    (d / "w.bin").write_bytes(payload)
    (d / "sub" / "w.bin").write_bytes(payload[:1024])
    (root / "secret.bin").write_bytes(payload)
    (root / "outside").mkdir()
    (root / "outside" / "w.bin").write_bytes(payload)
    os.symlink(root / "secret.bin", d / "out_link.bin")
    os.symlink(root / "outside", d / "out_dir")
    os.symlink("sub/w.bin", d / "in_link.bin")
    os.symlink("loop.bin", d / "loop.bin")
    return d


def _inside(path: str, root: str) -> bool:
    real = os.path.realpath(path)
    return os.path.commonpath([root, real]) == root


def _overwrite(path: Path, data: bytes) -> None:
    """Rewrite the case file in place: truncating it to 0 first makes ext4 flush it on close (auto_da_alloc),
    which cost 4 ms a case."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _check(path: Path, data: bytes, stats: Counter[str]) -> None:
    """Open one case; assert the outcome is a FormatError naming a file, or a sound model."""
    _overwrite(path, data)
    root = os.path.realpath(path.parent)
    work = WorkCounter(limit=2 * len(data) + 1000)
    with _watch() as opened:
        try:
            f = open_onnx(path, work=work)
        except FormatError as exc:
            assert exc.path is not None and exc.path in str(exc), exc
            stats["rejected"] += 1
        else:
            stats["accepted"] += 1
            _sound(f, root, stats)
    assert all(_inside(p, root) for p in opened), opened
    stats["max_steps_per_byte_x100"] = max(stats["max_steps_per_byte_x100"], 100 * work.steps // max(1, len(data)))


def _sound(f: Any, root: str, stats: Counter[str]) -> None:
    assert set(f.weights).isdisjoint(f.inline)
    assert set(f.onnx_types) == set(f.weights) | set(f.inline) == set(f.shapes)
    for info in f.weights.values():
        assert _inside(info.file, root)
        assert info.offset >= 0 and info.offset + info.nbytes <= os.path.getsize(info.file)
        assert tensor_nbytes(info.dtype, info.shape) == info.nbytes
    for name in f.onnx_types:
        try:
            v = f.value(name, limit=1 << 16)
        except FormatError:
            stats["value_refused"] += 1
        else:
            assert v.shape == f.shapes[name]
    assert isinstance(f.model, onnx.ModelProto)
    assert all(isinstance(n.name, str) and isinstance(n.op_type, str) for n in f.model.graph.node)


@pytest.fixture(scope="module")
def corpus() -> dict[str, bytes]:
    return _corpus()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_sandbox(tmp_path_factory.mktemp("onnx_fuzz"))


def test_the_corpus_opens(corpus: dict[str, bytes], sandbox: Path) -> None:
    stats: Counter[str] = Counter()
    for name, data in corpus.items():
        _check(sandbox / "case.onnx", data, stats)
        assert stats["accepted"] == list(corpus).index(name) + 1, name
    f = open_onnx(sandbox / "case.onnx")
    assert "sp" in f.inline  # the last model: its sparse initializer, densified


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["mlp", "branch", "ext", "sparse"]), seed=st.integers(0, 2**32 - 1))
def test_mutated_models_fail_cleanly(corpus: dict[str, bytes], sandbox: Path, base: str, seed: int) -> None:
    rng = random.Random(seed)
    _check(sandbox / "case.onnx", _mutate(rng, corpus[base], list(corpus.values())), Counter())


@settings(max_examples=200, deadline=None)
@given(location=st.one_of(st.sampled_from(HOSTILE_LOCATIONS), st.text(max_size=12)),
       offset=st.one_of(st.none(), st.integers(-5, 2**66).map(str), st.text(max_size=4)),
       length=st.one_of(st.none(), st.integers(-5, 2**66).map(str), st.sampled_from(["1024", "160", "64"])),
       dims=st.sampled_from([[16, 16], [40], [0], [], [1 << 40, 1 << 40], [0, 1 << 62]]))
def test_lying_external_data_fails_cleanly(sandbox: Path, location: str, offset: str | None, length: str | None,
                                           dims: list[int]) -> None:
    t = TensorProto(name="E", data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=value)
    _check(sandbox / "case.onnx", _model(_graph("g", [helper.make_node("Identity", ["x"], ["y"])], [t])), Counter())


def test_the_watch_sees_every_open(tmp_path: Path) -> None:
    """The no-read-outside check is only as good as the hook: it must see os.open and open()."""
    target = tmp_path / "f"
    target.write_bytes(b"x")
    with _watch() as opened:
        os.close(os.open(target, os.O_RDONLY))
        with open(target, "rb"):
            pass
    assert opened == [str(target), str(target)]
    assert not _inside(str(target), os.path.realpath(tmp_path / "elsewhere"))


@pytest.mark.slow
def test_a_hundred_thousand_mutated_files(corpus: dict[str, bytes], sandbox: Path) -> None:
    rng = random.Random(SEED)
    bases = list(corpus.values())
    stats: Counter[str] = Counter()
    t0 = time.perf_counter()
    for i in range(CASES):
        data = _lying_external(rng) if i % 10 == 9 else _mutate(rng, rng.choice(bases), bases)
        try:
            _check(sandbox / "case.onnx", data, stats)
        except AssertionError:
            (sandbox.parent / f"failing-{i}.onnx").write_bytes(data)
            raise
    elapsed = time.perf_counter() - t0
    print(f"\n{CASES} cases in {elapsed:.1f} s: {dict(stats)}")
    assert stats["rejected"] > CASES // 2 and stats["accepted"] > CASES // 100, stats
