"""`uaii inspect`, `uaii convert` and `uaii run` on ONNX files, for real (no fake Session).

Models: a tiny language-model-shaped graph without KV I/O (ids -> table -> MatMul -> logits) and the hand-built
exporter-style causal LM with KV I/O of tests/loaders/onnx_lm_support.py, each with a word-level tokenizer.json
beside it whose words ``w0 .. wN`` are the ids 0..N (so prompts and tokens are easy to write down).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_lm_support import NEW, PROMPT, VOCAB, exported_like, ort_greedy, ort_run  # noqa: E402

from uaii.runtime import Session  # noqa: E402
from uaii.runtime.cli import main  # noqa: E402

RUN = ["--kv-dtype", "f32", "--kv-window", "0", "--threads", "1"]  # onnxruntime's precision, no window


def _tokenizer(directory: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))


def _prompt(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture
def forward_model(tmp_path: Path) -> Path:
    """ids [batch, sequence] -> Gather(table) -> MatMul -> logits: an LM-shaped graph without a KV cache."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["h"]),
             helper.make_node("MatMul", ["h", "proj"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence", 32])],
        initializer=[numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "table"),
                     numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "proj")])
    directory = tmp_path / "tiny"
    directory.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10),
              directory / "model.onnx")
    _tokenizer(directory, 32)
    return directory / "model.onnx"


@pytest.fixture
def kv_model(tmp_path: Path) -> Path:
    directory = tmp_path / "kv"
    directory.mkdir()
    onnx.save(exported_like(), directory / "model.onnx")
    _tokenizer(directory, VOCAB)
    return directory / "model.onnx"


def run(argv: list[Any], capsys: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_describes_an_onnx_model(forward_model: Path, capsys: Any) -> None:
    code, out, err = run(["inspect", forward_model, "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["format"] == "onnx" and obj["architecture"] == "onnx"
    assert obj["n_params"] == 32 * 16 + 16 * 32 and obj["config"]["vocab_size"] == 32
    assert obj["graph"]["nodes"] == 5  # Less + Add + Where (negative ids count from the end) + Embedding + MatMul
    assert obj["import_notes"] == []
    code, out, _ = run(["inspect", forward_model.parent], capsys)  # the directory holding it
    assert code == 0 and "onnx" in out and "import note" not in out


def test_inspect_shows_the_import_notes(tmp_path: Path, capsys: Any) -> None:
    """What the importer approximated or ignored is printed, not only stored in the metadata."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16, saturate=0)], "noted",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10),
              tmp_path / "model.onnx")
    code, out, err = run(["inspect", tmp_path / "model.onnx"], capsys)
    assert code == 0, err
    assert "import note:" in out and "saturate=0" in out
    code, out, _ = run(["inspect", tmp_path / "model.onnx", "--json"], capsys)
    notes = json.loads(out)["import_notes"]
    assert len(notes) == 1 and "node 'Cast#0'" in notes[0]


def test_convert_writes_an_ir_file_that_runs_like_the_onnx(forward_model: Path, capsys: Any) -> None:
    out_file = forward_model.parent / "model.uaii"
    code, out, err = run(["convert", forward_model, "-o", out_file], capsys)
    assert code == 0, err
    assert out_file.is_file() and "5 nodes, 2 weights referenced" in out
    assert out_file.stat().st_size < 16 << 10  # references, not the weights
    code, _, err = run(["convert", forward_model, "-o", out_file], capsys)
    assert code == 1 and "exists" in err
    ids = np.asarray([[3, 1, 4, 1, 5]], np.int64)
    want = ort_run(forward_model, {"input_ids": ids})["logits"]
    with Session(out_file) as s:
        got = s.run({"input_ids": ids})["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_run_without_kv_io_says_why_it_cannot_decode(forward_model: Path, capsys: Any) -> None:
    code, out, err = run(["run", forward_model, "-p", "w1 w2", "-n", "3", *RUN], capsys)
    assert code == 1 and out == ""
    assert "cannot decode incrementally" in err and "past_key_values" in err and "Session.run" in err
    assert err.count("\n") == 1  # one line, no traceback


def test_run_with_kv_io_decodes_like_onnxruntime(kv_model: Path, capsys: Any) -> None:
    want, _ = ort_greedy(kv_model, PROMPT, NEW, 2, positions=True)
    code, out, err = run(["run", kv_model, "-p", _prompt(PROMPT), "-n", NEW, "--json", *RUN], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["prompt_tokens"] == PROMPT
    assert obj["tokens"] == want
    assert obj["text"].split() == [f"w{i}" for i in want]
