"""Fuzz the codec-1 reader (the C++ runtime's .uaii): mutants raise FormatError with an offset and nothing
else, each within a time bound; lying counts fail at once without allocating. `UAII_FUZZ_CASES` sets the
case count."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
import serialize_support as S

from uaii.ir import FormatError, Graph, Node
from uaii.ir.serialize import from_bytes


def _all_attribute_types() -> Graph:
    g = S.toy_mlp()
    rich = S.rich_graph().nodes[1]
    nodes = (*g.nodes[:1], Node("act", "Relu", ("h",), ("h_act",), rich.attributes), *g.nodes[2:])
    return Graph(g.name, g.inputs, g.outputs, nodes, g.tensors, g.metadata, ir_version=(1, 0))


SEEDS = [S.write_codec1(S.toy_mlp()), S.write_codec1(_all_attribute_types(), first_id=1000)]


def test_fuzz_codec1() -> None:
    stats = S.run_fuzz("codec1", SEEDS, S.mutate_bytes, from_bytes)
    assert stats["rejected"] > stats["cases"] // 2


@pytest.mark.parametrize("index", range(len(SEEDS)))
def test_every_truncation_fails_with_its_offset(index: int) -> None:
    seed = SEEDS[index]
    for n in range(len(seed)):
        with pytest.raises(FormatError) as e:
            from_bytes(seed[:n])
        assert e.value.offset is not None and e.value.offset <= n


@pytest.mark.parametrize("count_field", ["tensors", "name"])
def test_lying_count_fails_fast_without_allocating(count_field: str) -> None:
    """n_tensors = 2^32-1 (or a string length of 2^32-1) with 10 bytes left."""
    empty = struct.pack("<I", 0)
    if count_field == "tensors":
        data = b"UAIR" + struct.pack("<III", 1, 1, 0) + empty * 3 + struct.pack("<I", 0xFFFFFFFF) + bytes(10)
        at = 16 + 12
    else:
        data = b"UAIR" + struct.pack("<III", 1, 1, 0) + struct.pack("<I", 0xFFFFFFFF) + bytes(10)
        at = 16
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(FormatError) as e:
        from_bytes(data)
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert e.value.offset == at and "4294967295" in str(e.value)
    assert elapsed < 0.05 and peak < 64 * 1024
