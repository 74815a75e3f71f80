"""Fuzz the codec-2 reader (.uaii FlatBuffers): mutants raise FormatError with an offset and nothing else,
each within a time bound, whatever offsets, lengths and vtables the bytes claim. `UAII_FUZZ_CASES` sets the
case count."""

from __future__ import annotations

import pytest
import serialize_support as S

from uaii.ir import FormatError
from uaii.ir.serialize import from_bytes, to_bytes

SEEDS = [to_bytes(S.toy_mlp()), to_bytes(S.rich_graph())]


def test_fuzz_codec2() -> None:
    stats = S.run_fuzz("codec2", SEEDS, S.mutate_bytes, from_bytes)
    assert stats["rejected"] > stats["cases"] // 4


@pytest.mark.parametrize("index", range(len(SEEDS)))
def test_every_truncation_fails_with_an_offset(index: int) -> None:
    """A FlatBuffer ends in alignment padding; cutting only that padding loses nothing and still reads."""
    seed = SEEDS[index]
    padding = len(seed) - len(seed.rstrip(b"\x00")) - 1  # keep the last string's terminator
    for n in range(len(seed) - padding):
        with pytest.raises(FormatError) as e:
            from_bytes(seed[:n])
        assert e.value.offset is not None and e.value.offset <= n
    for n in range(len(seed) - padding, len(seed)):
        assert to_bytes(from_bytes(seed[:n])) == seed
