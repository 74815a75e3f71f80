"""`StringTable` and `scan_gguf_strings`: a list of str in behaviour, a blob + offsets + hash table in memory."""

from __future__ import annotations

import pickle
import struct
from typing import NoReturn

import numpy as np
import pytest

from uaii.tokenizers import StringTable
from uaii.tokenizers.spm import SpmEncoder
from uaii.tokenizers.string_table import scan_gguf_strings

WORDS = ["", "a", "héllo", "▁the", "<0x41>", "a", "😀", "tab\there", "a b", ""]


def test_behaves_like_the_list_it_holds() -> None:
    t = StringTable.from_strings(WORDS)
    assert len(t) == len(WORDS) and list(t) == WORDS and t == WORDS and t.tolist() == WORDS
    assert t[2] == "héllo" and t[-1] == "" and t[-4] == "😀" and t[1:4] == WORDS[1:4] and t[::-3] == WORDS[::-3]
    assert t.raw(2) == "héllo".encode() and t != WORDS[:-1]
    with pytest.raises(IndexError):
        t[len(WORDS)]
    with pytest.raises(IndexError):
        t[-len(WORDS) - 1]
    assert StringTable.from_strings([]) == [] and not StringTable.from_strings([])


def test_find_returns_the_last_index_or_the_first_when_asked() -> None:
    t = StringTable.from_strings(WORDS)
    assert t.find("a") == 5 and t.find("a", first=True) == 1 and t.find(b"a") == 5
    assert t.find("") == 9 and t.find("", first=True) == 0
    assert t.find("😀") == 6 and t.find("héllo".encode()) == 2 and t.find("nope") is None
    assert "▁the" in t and "the" not in t and 3 not in t  # type: ignore[comparison-overlap]
    assert t.index_of("a b") == 8
    with pytest.raises(KeyError):
        t.index_of("zzz")


def test_every_piece_of_a_large_table_is_found() -> None:
    words = [f"w{i}" for i in range(5000)] + ["w17"]
    t = StringTable.from_strings(words)
    assert all(t.find(w) == i for i, w in enumerate(words[:-1]) if i != 17)
    assert t.find("w17") == 5000 and t.find("w17", first=True) == 17 and t.find("w5000") is None
    assert t.nbytes < 5 * len(words) + 4 * (len(words) + 1) + 4 * 16384


def test_invalid_utf8_round_trips() -> None:
    raw = [b"\xe2\x96", b"ok", b"\xff"]
    blob = b"".join(raw)
    t = StringTable(blob, np.array([0, 2, 4, 5]))
    assert t[0] == "\udce2\udc96" and t.raw(0) == raw[0] and t.find(t[2]) == 2
    with pytest.raises(ValueError):
        StringTable(blob, np.array([0, 2]))


def _gguf_strings(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in items)


def _fail(i: int, at: int, n: int | None) -> NoReturn:
    raise ValueError((i, at, n))


@pytest.mark.parametrize("count", [0, 1, 3, 70000])
def test_scan_reads_a_gguf_string_array(count: int) -> None:
    items = [f"s{i}".encode() * (i % 3) for i in range(count)]
    data = b"head" + _gguf_strings(items) + b"tail"
    table, end = scan_gguf_strings(data, 4, count, len(data), _fail)
    assert end == len(data) - 4 and len(table) == count
    assert all(table.raw(i) == s for i, s in enumerate(items))


def test_scan_reports_the_record_that_does_not_fit() -> None:
    data = _gguf_strings([b"abc", b"de"])
    with pytest.raises(ValueError, match=r"\(1, 11, None\)"):
        scan_gguf_strings(data[:15], 0, 2, 15, _fail)          # the second length field is cut
    with pytest.raises(ValueError, match=r"\(1, 11, 2\)"):
        scan_gguf_strings(data[:-1], 0, 2, len(data) - 1, _fail)  # the second string is cut
    with pytest.raises(ValueError, match=r"\(2, 21, None\)"):
        scan_gguf_strings(data, 0, 3, len(data), _fail)


def test_spm_without_byte_pieces_falls_back_to_unknown() -> None:
    pieces = StringTable.from_strings(["<unk>", "▁", "a", "b", "ab", "▁ab"])
    enc = SpmEncoder(pieces, np.array([0, -1, -2, -2, -1, 0], dtype=np.float32), unk_id=0)
    assert enc.encode(" ab") == [5] and enc.encode("abc") == [4, 0] and enc.encode("") == []
    with pytest.raises(Exception, match="neither byte pieces nor an unknown token"):
        SpmEncoder(pieces, np.zeros(6, dtype=np.float32), unk_id=None).encode("z")


def test_pickles_without_its_lookup_table() -> None:
    t = StringTable.from_strings(WORDS)
    assert t.find("😀") == 6
    u = pickle.loads(pickle.dumps(t))
    assert u == t and u.find("😀") == 6 and u.find("a", first=True) == 1
