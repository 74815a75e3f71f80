"""Format detection says what each loader found: when the extension or the content picks a loader, that loader's
own error is the message; when nothing matches, every loader's reason is listed."""

from __future__ import annotations

import re
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import FormatError, UaiiError
from uaii.loaders import LoaderError, detect_format, load_model


def _raises(path: Path, kind: type[UaiiError], pattern: str) -> str:
    for call in (detect_format, load_model):
        with pytest.raises(kind, match=pattern) as e:
            call(path)
        assert "format not recognized" not in str(e.value)
    return str(e.value)


def test_an_empty_gguf_says_it_is_empty(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"")
    _raises(tmp_path / "m.gguf", FormatError, r"^\[gguf\] .*m\.gguf: empty file; expected a GGUF header")


@pytest.mark.parametrize(("head", "found"), [(b"GGML\x03\x00\x00\x00" + b"\0" * 32, "b'GGML'"), (b"GG", "b'GG'"),
                                             (b"\x89PNG\r\n\x1a\n", re.escape("b'\\x89PNG'"))])
def test_a_gguf_with_bad_magic_names_what_it_found(tmp_path: Path, head: bytes, found: str) -> None:
    (tmp_path / "m.gguf").write_bytes(head)
    _raises(tmp_path / "m.gguf", FormatError, rf"expected magic b'GGUF', found {found} \(at byte offset 0x0\)")


def test_a_lone_safetensors_says_config_json_is_missing_beside_it(tmp_path: Path) -> None:
    f = H.write_safetensors(tmp_path / "model.safetensors", {"x": np.zeros(4, np.float32)})
    (tmp_path / "tokenizer.json").write_text("{}")
    text = _raises(f, LoaderError, r"^\[hf\] .*model\.safetensors: no config\.json beside it")
    assert "only tensors" in text and "model.safetensors, tokenizer.json" in text


def test_a_directory_without_config_json_lists_what_it_has(tmp_path: Path) -> None:
    H.write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"x": np.zeros(4, np.float32)})
    (tmp_path / "tokenizer.json").write_text("{}")
    text = _raises(tmp_path, LoaderError, r"^\[hf\] .*: no config\.json; a Hugging Face model directory needs")
    assert "it holds model-00001-of-00002.safetensors, tokenizer.json" in text


def test_a_directory_with_two_gguf_models_asks_which(tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        H.small_gguf(tmp_path / name)
    _raises(tmp_path, LoaderError, r"2 GGUF models \(a\.gguf, b\.gguf\); pass the file to load")


def test_a_directory_with_a_broken_gguf_names_it(tmp_path: Path) -> None:
    (tmp_path / "only.gguf").write_bytes(b"")
    _raises(tmp_path, FormatError, r"only\.gguf: empty file")


def test_nothing_matches_lists_each_loaders_reason(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(LoaderError) as e:
        load_model(tmp_path / "notes.txt")
    text = str(e.value)
    assert "format not recognized" in text
    assert " — gguf: not a GGUF file: expected magic b'GGUF', found b'not '" in text
    assert " — hf: not a directory with config.json, nor a .safetensors file" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LoaderError, match=r"format not recognized — onnx: no \*\.onnx file in the directory — hf: no "
                                          r"config\.json;.*the directory is empty — gguf: no \*\.gguf file in the "
                                          r"directory$"):
        detect_format(empty)


def test_an_ir_file_is_pointed_to_the_runtime(tmp_path: Path) -> None:
    (tmp_path / "m.uaii").write_bytes(b"UAII")
    with pytest.raises(LoaderError, match=r"m\.uaii is a UAII IR graph, not a model file: open it with"):
        detect_format(tmp_path / "m.uaii")


def test_valid_inputs_still_detect(tmp_path: Path) -> None:
    p = H.small_gguf(tmp_path / "one.gguf")[0]
    assert detect_format(p) == "gguf" and detect_format(tmp_path) == "gguf"


def test_a_directory_scan_opens_first_shards_only_and_each_file_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The name says whether a file can start a model; only such a file is opened to read its magic. Explaining a
    directory reads each file's magic once, then the reader opens the broken file it names."""
    import builtins

    import uaii.loaders.gguf as gguf_reader
    from uaii.loaders.detect import explain_gguf
    from uaii.loaders.model import GGUF_LOADER

    opened: list[str] = []

    def counting_open(path: str, *args: object, **kw: object) -> object:
        opened.append(Path(path).name)
        return builtins.open(path, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(gguf_reader, "open", counting_open, raising=False)
    split = tmp_path / "split"
    split.mkdir()
    for i in (1, 2, 3):
        (split / f"m-0000{i}-of-00003.gguf").write_bytes(b"GGUF" + bytes(20))
    assert GGUF_LOADER.detect(split) and opened == ["m-00001-of-00003.gguf"]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.gguf").write_bytes(b"")
    (broken / "b.gguf").write_bytes(b"GGML")
    opened.clear()
    assert "a.gguf: empty file" in str(explain_gguf(broken).error)
    assert opened == ["a.gguf", "b.gguf", "a.gguf"]



def test_a_validation_failure_names_the_model() -> None:
    """The validator sees only the graph; the loader's check adds the file it read."""
    from uaii.ir import DType, Node, Tensor, make_graph
    from uaii.ir.validator import ValidationError
    from uaii.loaders.model import check_graph

    g = make_graph("g", [Node("mm", "MatMul", ("x", "w"), ("y",), {"transpose_b": True})],
                   [Tensor("x", DType.F32, ("seq", 8)), Tensor("w", DType.F32, (4, 6)),
                    Tensor("y", DType.F32, ("seq", 4))], ["x", "w"], ["y"])
    with pytest.raises(ValidationError) as e:
        check_graph(g, source="models/m.gguf")
    assert str(e.value).splitlines() == [
        "[validate] models/m.gguf: graph 'g' failed validation with 1 problem:",
        "  [shape] node 0 'mm' (MatMul): inner dimensions differ: A [seq, 8] has K=8, B [4, 6] (transpose_b=True) "
        "has K=6"]
