"""Property tests: graphs ↔ canonical JSON ↔ codec-2 binary round-trip bit-exactly, and every writer is
deterministic (same graph → same bytes; JSON → graph → JSON is the identity on canonical files)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import serialize_support as S
from hypothesis import HealthCheck, given, settings

from uaii.ir import Graph
from uaii.ir.serialize import dumps_json, from_bytes, load, loads_json, save, to_bytes

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same(a: Graph, b: Graph) -> None:
    assert S.graph_key(a) == S.graph_key(b)


@PROPS
@given(S.graphs())
def test_json_round_trip_is_exact_and_canonical(g: Graph) -> None:
    text = dumps_json(g)
    back = loads_json(text)
    assert_same(back, g)
    assert dumps_json(back) == text
    assert_same(loads_json(text.encode("utf-8")), g)


@PROPS
@given(S.graphs())
def test_binary_round_trip_is_exact_and_deterministic(g: Graph) -> None:
    data = to_bytes(g)
    assert data[:8] == b"UAIR\x02\x00\x00\x00"
    back = from_bytes(data)
    assert_same(back, g)
    assert to_bytes(back) == data
    assert to_bytes(g) == data


@PROPS
@given(S.graphs())
def test_json_and_binary_agree(g: Graph) -> None:
    text = dumps_json(g)
    via_binary = from_bytes(to_bytes(loads_json(text)))
    assert dumps_json(via_binary) == text
    assert to_bytes(loads_json(dumps_json(from_bytes(to_bytes(g))))) == to_bytes(g)


@settings(max_examples=25, deadline=None)
@given(S.graphs())
def test_files_round_trip_by_extension(g: Graph) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("m.uaii.json", "m.json", "m.uaii"):
            path = Path(tmp) / name
            save(g, path)
            assert_same(load(path), g)
        assert (Path(tmp) / "m.uaii.json").read_text(encoding="utf-8") == dumps_json(g)
        assert (Path(tmp) / "m.uaii").read_bytes() == to_bytes(g)
        assert sorted(p.name for p in Path(tmp).iterdir()) == ["m.json", "m.uaii", "m.uaii.json"]


def test_rich_sample_round_trips() -> None:
    g = S.rich_graph()
    assert_same(loads_json(dumps_json(g)), g)
    assert_same(from_bytes(to_bytes(g)), g)
