"""`python -m uaii.ir` validate / convert / show, with the documented exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uaii.ir import DType, Node, Tensor, WeightRef, load, make_graph, save
from uaii.ir.__main__ import EXIT_ERROR, EXIT_INVALID, EXIT_OK, main


def _mlp(op: str = "Relu"):
    return make_graph(
        "mlp",
        [Node("fc", "MatMul", ("x", "w"), ("h",), {"transpose_b": True}), Node("act", op, ("h",), ("y",))],
        [Tensor("x", DType.F32, ("seq", 32)), Tensor("w", DType.Q4_0, (32, 32), weight=WeightRef("m.gguf", "w")),
         Tensor("h", DType.F32, ("seq", 32)), Tensor("y", DType.F32, ("seq", 32))],
        ["x"], ["y"], {"source": "test"})


def test_validate_ok_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.uaii.json"
    save(_mlp(), f)
    assert main(["validate", str(f)]) == EXIT_OK
    assert "valid" in capsys.readouterr().out
    assert main(["validate", str(f), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and report["diagnostics"] == []


def test_validate_invalid_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.uaii"
    save(_mlp(op="NoSuchOp"), f)
    assert main(["validate", str(f), "--json"]) == EXIT_INVALID
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False
    assert report["diagnostics"][0]["code"] == "unknown-op"
    assert report["diagnostics"][0]["node"] == "act"


def test_convert_roundtrip(tmp_path: Path) -> None:
    src, mid, back = tmp_path / "a.uaii.json", tmp_path / "b.uaii", tmp_path / "c.json"
    save(_mlp(), src)
    assert main(["convert", str(src), str(mid)]) == EXIT_OK
    assert main(["convert", str(mid), str(back)]) == EXIT_OK
    assert load(back) == load(src)
    assert mid.read_bytes()[:4] == b"UAIR"
    assert back.read_bytes() == src.read_bytes()  # canonical JSON: same graph, same bytes


def test_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "corrupt.uaii"
    bad.write_bytes(b"UAIR\x02\x00\x00\x00garbage")
    assert main(["validate", str(bad)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "corrupt.uaii" in err and "offset" in err
    assert main(["show", str(tmp_path / "missing.uaii")]) == EXIT_ERROR
    assert main(["convert", str(bad), str(tmp_path / "x.txt")]) == EXIT_ERROR
    assert not (tmp_path / "x.txt").exists()
    assert main(["frobnicate"]) == EXIT_ERROR


def test_show_and_module_entry_point(tmp_path: Path) -> None:
    f = tmp_path / "g.uaii"
    save(_mlp(), f)
    out = subprocess.run([sys.executable, "-m", "uaii.ir", "show", str(f)], capture_output=True, text=True,
                         check=True).stdout
    assert "graph 'mlp'" in out and "MatMul×1" in out and "q4_0×1" in out
