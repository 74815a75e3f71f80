"""Test helpers for the IR serializers: graph strategies, a bit-exact comparison, a codec-1 writer (test-only;
the library only reads codec 1), sample graphs and the byte mutators of the fuzz tests.

Test modules load this file with ``load_support()`` below (copied into each, since tests/ is not a package).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
import os
import random
import signal
import struct
import threading
import time
from typing import Any

from hypothesis import strategies as st

from uaii.ir import Attribute, AttrType, DType, FormatError, Graph, Node, StorageHint, Tensor, WeightRef
from uaii.ir.serialize._floats import float_bits, float_from_bits

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
CODEC1_DTYPES = {DType.F32: 1, DType.F16: 2, DType.BF16: 3, DType.I8: 4, DType.I32: 5, DType.I64: 6,
                 DType.U8: 7, DType.U32: 8, DType.BOOL: 9}


# --- comparison ---------------------------------------------------------------------------------------------
def graph_key(obj: Any) -> Any:
    """A structure equal for two graphs exactly when they are equal bit for bit (floats by their bits)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj).__name__, tuple(graph_key(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, float):
        return "float", float_bits(obj)
    if isinstance(obj, tuple | list):
        return tuple(graph_key(x) for x in obj)
    if isinstance(obj, bool):
        return "bool", obj
    if isinstance(obj, enum.Enum):
        return type(obj).__name__, obj.value
    return obj


# --- strategies ---------------------------------------------------------------------------------------------
TEXT = st.text(max_size=10)  # any code point but surrogates: NUL, RTL, emoji, combining marks
NAMES = st.text(min_size=1, max_size=10)
SYMBOLS = st.sampled_from(["seq", "past", "batch", "n_ctx", "héads", "_k0", "ζ"]) | st.from_regex(
    r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
SPECIAL_FLOATS = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, float("inf"),
                  float("-inf"), float("nan"), float_from_bits(0xFFF8000000000000),
                  float_from_bits(0x7FF0000000000001), float_from_bits(0x7FF4000000000abc), 0.1, 1e-05]
FLOATS = st.floats() | st.sampled_from(SPECIAL_FLOATS)
I64 = st.integers(I64_MIN, I64_MAX) | st.sampled_from([I64_MIN, I64_MAX, 0, -1, 1 << 32, -(1 << 31)])
REF_TEXT = st.text(min_size=1, max_size=10).filter(lambda s: "#" not in s and "\x00" not in s)


def attributes() -> st.SearchStrategy[Attribute]:
    return st.one_of(
        st.builds(Attribute, st.just(AttrType.STRING), TEXT),
        st.builds(Attribute, st.just(AttrType.INT), I64),
        st.builds(Attribute, st.just(AttrType.FLOAT), FLOATS),
        st.builds(Attribute, st.just(AttrType.BOOL), st.booleans()),
        st.builds(Attribute, st.just(AttrType.INT_ARRAY), st.lists(I64, max_size=5).map(tuple)),
        st.builds(Attribute, st.just(AttrType.FLOAT_ARRAY), st.lists(FLOATS, max_size=5).map(tuple)),
    )


weight_refs = st.builds(
    lambda path, tensor, expert: WeightRef(path, tensor, expert if tensor is not None else None),
    REF_TEXT, st.none() | REF_TEXT, st.none() | st.integers(0, 1 << 40))


@st.composite
def tensors(draw: Any, name: str, codec1: bool = False) -> Tensor:
    dtypes = list(CODEC1_DTYPES) if codec1 else list(DType)
    dtype = draw(st.sampled_from(dtypes))
    kind = draw(st.sampled_from(["value", "weight"] if codec1 else ["value", "weight", "constant"]))
    hint = draw(st.sampled_from(list(StorageHint)))
    if kind == "constant":
        if dtype.is_quantized:
            blocks = draw(st.integers(0, 2))
            shape: tuple[int | str, ...] = (draw(st.integers(0, 2)), dtype.block_size * blocks)
        else:
            shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        size = dtype.nbytes(math.prod(int(d) for d in shape))
        data = draw(st.binary(min_size=size, max_size=size))
        return Tensor(name, dtype, shape, data=data, storage_hint=hint, is_weight=draw(st.booleans()))
    dim = st.integers(0, I64_MAX) if codec1 else st.integers(0, I64_MAX) | SYMBOLS
    shape = tuple(draw(st.lists(dim, max_size=4)))
    weight = draw(weight_refs) if kind == "weight" else None
    return Tensor(name, dtype, shape, weight=weight, storage_hint=hint, is_weight=draw(st.booleans()))


@st.composite
def graphs(draw: Any, codec1: bool = False) -> Graph:
    """Random valid graphs (every reference names a declared tensor); ``codec1``: only what IR 1.0 holds."""
    names = draw(st.lists(NAMES, max_size=6, unique=True))
    ts = [draw(tensors(n, codec1)) for n in names]
    ref = st.sampled_from([*names, ""]) if names else st.just("")
    nodes = draw(st.lists(st.builds(
        Node, name=TEXT, op=NAMES, inputs=st.lists(ref, max_size=4).map(tuple),
        outputs=st.lists(ref, max_size=3).map(tuple),
        attributes=st.dictionaries(TEXT, attributes(), max_size=5).map(lambda d: tuple(d.items())),
        version=st.integers(0, 10**18 - 1)), max_size=5))
    return Graph(name=draw(TEXT), inputs=tuple(draw(st.lists(ref, max_size=3))),
                 outputs=tuple(draw(st.lists(ref, max_size=3))), nodes=tuple(nodes), tensors=tuple(ts),
                 metadata=tuple(draw(st.dictionaries(TEXT, TEXT, max_size=4)).items()),
                 producer=draw(TEXT), domain=draw(TEXT),
                 ir_version=(1, draw(st.integers(0, (1 << 32) - 1))))


# --- codec 1 (test-only writer, from the layout in docs/formats.md) -----------------------------------------
def _s(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def _ids(ids: list[int]) -> bytes:
    return struct.pack(f"<I{len(ids)}Q", len(ids), *ids)


def _c1_attr(key: str, a: Attribute) -> bytes:
    out = _s(key) + struct.pack("<B", a.type.code)
    v: Any = a.value
    if a.type is AttrType.STRING:
        return out + _s(v)
    if a.type is AttrType.INT:
        return out + struct.pack("<q", v)
    if a.type is AttrType.FLOAT:
        return out + struct.pack("<d", v)
    if a.type is AttrType.BOOL:
        return out + struct.pack("<B", v)
    code = "q" if a.type is AttrType.INT_ARRAY else "d"
    return out + struct.pack(f"<I{len(v)}{code}", len(v), *v)


def write_codec1(g: Graph, *, first_id: int = 1, meta_order: str = "reversed") -> bytes:
    """Codec-1 bytes of ``g`` as the C++ runtime writes them (metadata in a hash-map-like order)."""
    ids = {t.name: first_id + i for i, t in enumerate(g.tensors)}
    ref = lambda names: _ids([ids[n] if n else 0 for n in names])  # noqa: E731
    out = [struct.pack("<4sIII", b"UAIR", 1, *g.ir_version), _s(g.name), _s(g.producer), _s(g.domain),
           struct.pack("<I", len(g.tensors))]
    for i, t in enumerate(g.tensors):
        out += [struct.pack("<Q", first_id + i), _s(t.name),
                struct.pack("<BI", CODEC1_DTYPES[t.dtype], t.rank),
                struct.pack(f"<{t.rank}q", *t.shape), struct.pack("<BB", t.storage_hint.code, t.is_weight),
                _s(str(t.weight) if t.weight else "")]
    out.append(struct.pack("<I", len(g.nodes)))
    for i, n in enumerate(g.nodes):
        out += [struct.pack("<Q", 7 + i), _s(n.name), _s(n.op), _s(str(n.version)), ref(n.inputs),
                ref(n.outputs), struct.pack("<I", len(n.attributes))]
        out += [_c1_attr(k, a) for k, a in n.attributes]
    out += [ref(g.inputs), ref(g.outputs), struct.pack("<I", len(g.metadata))]
    meta = list(g.metadata)
    for k, v in reversed(meta) if meta_order == "reversed" else meta:
        out += [_s(k), _s(v)]
    return b"".join(out)


def cpp_style_json(g: Graph, *, first_id: int = 1) -> str:
    """The JSON twin the C++ runtime would write: keys in its order, "unspecified", no quant_format."""
    ids = {t.name: first_id + i for i, t in enumerate(g.tensors)}
    ref = lambda names: [ids[n] if n else 0 for n in names]  # noqa: E731
    doc = {
        "ir_version": {"major": g.ir_version[0], "minor": g.ir_version[1]},
        "name": g.name, "producer": g.producer, "domain": g.domain,
        "tensors": [{"id": first_id + i, "name": t.name, "dtype": t.dtype.value, "shape": list(t.shape),
                     "storage_hint": t.storage_hint.value or "unspecified", "is_weight": t.is_weight,
                     "weight_ref": str(t.weight) if t.weight else ""} for i, t in enumerate(g.tensors)],
        "nodes": [{"id": 7 + i, "name": n.name, "op_name": n.op, "op_version": str(n.version),
                   "inputs": ref(n.inputs), "outputs": ref(n.outputs),
                   "attributes": [{"key": k, "type": a.type.value, "value": _cpp_json_value(a)}
                                  for k, a in n.attributes]} for i, n in enumerate(g.nodes)],
        "inputs": ref(g.inputs), "outputs": ref(g.outputs), "metadata": dict(g.metadata),
    }
    return json.dumps(doc, indent=4)


def _cpp_json_value(a: Attribute) -> Any:
    from uaii.ir.serialize.json_codec import _json_float

    if a.type is AttrType.FLOAT:
        return _json_float(a.value)  # type: ignore[arg-type]
    if a.type is AttrType.FLOAT_ARRAY:
        return [_json_float(x) for x in a.value]  # type: ignore[union-attr]
    return list(a.value) if isinstance(a.value, tuple) else a.value


# --- sample graphs (fuzz seeds) -----------------------------------------------------------------------------
def toy_mlp() -> Graph:
    """The C++ runtime's toy MLP (IR 1.0)."""
    f32 = DType.F32
    ts = [Tensor("x", f32, (1, 4), storage_hint=StorageHint.RAM),
          Tensor("w1", f32, (4, 8), weight=WeightRef("weights/w1.bin"), storage_hint=StorageHint.EXTERNAL),
          Tensor("h", f32, (1, 8)), Tensor("h_act", f32, (1, 8)),
          Tensor("w2", f32, (8, 4), weight=WeightRef("weights/w2.bin"), storage_hint=StorageHint.EXTERNAL),
          Tensor("y", f32, (1, 4)), Tensor("y_prob", f32, (1, 4))]
    nodes = [Node("fc1", "MatMul", ("x", "w1"), ("h",)), Node("act", "Relu", ("h",), ("h_act",)),
             Node("fc2", "MatMul", ("h_act", "w2"), ("y",), {"transpose_b": False}),
             Node("prob", "Softmax", ("y",), ("y_prob",), {"axis": -1})]
    return Graph("toy_mlp", ("x",), ("y_prob",), tuple(nodes), tuple(ts),
                 metadata=(("example", "phase2-toy-mlp"), ("note", "hand-authored")),
                 producer="hand-authored", ir_version=(1, 0))


def rich_graph() -> Graph:
    """IR 1.1 extensions (block dtypes, symbolic dims, inline constants, expert refs) and all attr types."""
    ts = [Tensor("tokens", DType.I32, ("batch", "seq")),
          Tensor("emb", DType.Q4_K, (32, 256), weight=WeightRef("m.gguf", "token_embd.weight")),
          Tensor("up", DType.Q8_0, (64, 32), weight=WeightRef("m.gguf", "ffn_up_exps", 3)),
          Tensor("shape", DType.I64, (2,), data=struct.pack("<2q", -1, 32)),
          Tensor("h", DType.F32, ("batch", "seq", 32)), Tensor("y", DType.BF16, ("seq", 64)),
          Tensor("résumé", DType.F16, ("seq",))]
    attrs = {"eps": 1e-05, "neg": -0.0, "tiny": 5e-324, "big": I64_MAX, "small": I64_MIN, "flag": True,
             "perm": (0, 2, 1), "scales": (0.5, float("inf"), -2.5), "mode": "néox", "nan": float("nan")}
    nodes = [Node("embed", "Embedding", ("tokens", "emb"), ("h",)),
             Node("reshape", "Reshape", ("h", "shape"), ("y",), attrs, version=2),
             Node("opt", "Attention", ("y", "", "résumé"), ("",), {"causal": False})]
    return Graph("rich ☃", ("tokens",), ("y",), tuple(nodes), tuple(ts), metadata={"arch": "llama", "ζ": "1"})


# --- fuzz mutators ------------------------------------------------------------------------------------------
HUGE_U32 = (0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 0x00010000, 0x0FFFFFFF)


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """1-3 random corruptions: bit flips, truncation, huge counts, random bytes, inserted/deleted ranges."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not buf:
            break
        op = rng.randrange(8)
        pos = rng.randrange(len(buf))
        if op == 0:
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            del buf[pos:]
        elif op == 2:
            buf[pos:pos + 4] = struct.pack("<I", rng.choice(HUGE_U32))
        elif op == 3:
            buf[pos] = rng.randrange(256)
        elif op == 4:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 5:
            del buf[pos:pos + rng.randint(1, 32)]
        elif op == 6:
            buf[pos:pos] = buf[pos:pos + rng.randint(1, 32)]
        else:
            word = pos - pos % 4
            if word + 4 <= len(buf):
                (v,) = struct.unpack_from("<I", buf, word)
                buf[word:word + 4] = struct.pack("<I", (v + rng.randint(-16, 16)) & 0xFFFFFFFF)
    return bytes(buf)


JSON_JUNK: list[Any] = [None, True, False, -1, 0, 1, 1 << 64, 1 << 63, -(1 << 63) - 1, 1.5, 1e308, -0.0, "",
                        "x", "q4_k", "nan:0xzz", "inf", "seq", [], {}, [1, 2, 3], {"a": 1}, ["x"], [[]],
                        "A" * 300]


def _junk(rng: random.Random) -> Any:
    return copy.deepcopy(rng.choice(JSON_JUNK))


def mutate_json_doc(doc: Any, rng: random.Random) -> Any:
    """Replace, delete or add one value somewhere in a parsed document (schema-level corruption)."""
    path: list[Any] = []
    node = doc
    while isinstance(node, dict | list) and node and rng.random() < 0.75:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if not path:
        return _junk(rng)
    parent, key = path[-1]
    r = rng.random()
    if r < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif r < 0.25 and isinstance(parent, dict):
        parent["unknown_" + str(rng.randrange(9))] = 1
    elif r < 0.35 and isinstance(parent, list):
        parent.append(_junk(rng))
    else:
        parent[key] = _junk(rng)
    return doc


def mutate_json_text(text: bytes, rng: random.Random) -> bytes:
    """Text-level corruption: byte mutations, deep nesting, overlong numbers, duplicated keys."""
    r = rng.random()
    if r < 0.8:
        return mutate_bytes(text, rng)
    pos = rng.randrange(len(text) + 1)
    junk = rng.choice([b"[" * 3000, b"{\"a\":" * 2000, b"9" * 5000, b"\"\\ud800\"", b"\xff\xfe", b"\x00",
                       b"\"name\": \"dup\", ", b"NaN", b"-Infinity", b"1e99999"])
    return text[:pos] + junk + text[pos:]


# --- fuzz runner --------------------------------------------------------------------------------------------
FUZZ_CASES = int(os.environ.get("UAII_FUZZ_CASES", "20000"))
"""Mutated inputs per format; CI runs the default, `UAII_FUZZ_CASES=1000000` runs a long campaign."""
FUZZ_SEED = int(os.environ.get("UAII_FUZZ_SEED", "0"))
PER_CASE_LIMIT_S = 2.0


class CaseTimeout(BaseException):  # not an Exception: nothing under test may swallow it
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout


def run_fuzz(name: str, seeds: list[bytes], mutate: Any, decode: Any, cases: int = FUZZ_CASES,
             seed: int = FUZZ_SEED) -> dict[str, Any]:
    """Decode ``cases`` mutants of ``seeds``: only FormatError (with an offset inside the input) may escape,
    and no case may run longer than PER_CASE_LIMIT_S (enforced with SIGALRM where available)."""
    rng = random.Random(f"{name}:{seed}")
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    stats = {"cases": cases, "rejected": 0, "accepted": 0, "slowest_s": 0.0}
    t_start = time.perf_counter()
    try:
        for i in range(cases):
            data = mutate(seeds[i % len(seeds)], rng)
            t0 = time.perf_counter()
            try:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, PER_CASE_LIMIT_S)
                decode(data)
                stats["accepted"] += 1
            except FormatError as e:
                if e.offset is None or not 0 <= e.offset <= len(data):
                    raise AssertionError(f"{name} case {i}: offset {e.offset} outside input: {e}") from e
                stats["rejected"] += 1
            except CaseTimeout:
                raise AssertionError(f"{name} case {i} (seed {seed}) ran past {PER_CASE_LIMIT_S}s; "
                                     f"input head {data[:120]!r}") from None
            except Exception as e:
                raise AssertionError(f"{name} case {i} (seed {seed}) raised {type(e).__name__}: {e}; "
                                     f"input head {data[:120]!r}") from e
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            stats["slowest_s"] = max(stats["slowest_s"], time.perf_counter() - t0)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
    stats["total_s"] = time.perf_counter() - t_start
    print(f"fuzz {name}: {stats}")
    return stats
