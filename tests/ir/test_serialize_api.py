"""The file-level API: format by extension, atomic saves, the names exported from uaii.ir."""

from __future__ import annotations

from pathlib import Path

import pytest
import serialize_support as S

import uaii.ir as ir
from uaii.ir import FormatError, Graph, GraphError, Node, UaiiError
from uaii.ir.serialize import decode, encode, file_format, load, save


def test_public_names() -> None:
    for name in ("load", "save", "loads_json", "dumps_json", "to_bytes", "from_bytes"):
        assert name in ir.__all__ and callable(getattr(ir, name))


@pytest.mark.parametrize("name, fmt", [("a.uaii.json", "json"), ("a.JSON", "json"),
                                       ("dir.x/a.uaii", "binary")])
def test_format_by_extension(name: str, fmt: str) -> None:
    assert file_format(name) == fmt


def test_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(UaiiError, match="extension"):
        save(S.toy_mlp(), tmp_path / "model.onnx")
    with pytest.raises(UaiiError, match="extension"):
        load(tmp_path / "model.bin")


def test_save_replaces_atomically_and_leaves_nothing_on_error(tmp_path: Path) -> None:
    path = tmp_path / "m.uaii"
    save(S.toy_mlp(), path)
    before = path.read_bytes()
    with pytest.raises(GraphError):
        save(Graph("bad", ("undeclared",), (), (), ()), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.uaii"]


def test_load_errors_carry_the_path(tmp_path: Path) -> None:
    path = tmp_path / "m.uaii.json"
    path.write_bytes(b'{"name": ')
    with pytest.raises(FormatError) as e:
        load(path)
    assert e.value.path == str(path) and e.value.offset == 9 and str(path) in str(e.value)


def test_encode_decode_pair() -> None:
    g = Graph("g", (), (), (Node("n", "Op", (), (), {"k": 1}),), ())
    for fmt in ("json", "binary"):
        assert decode(encode(g, fmt), fmt) == g  # type: ignore[arg-type]
