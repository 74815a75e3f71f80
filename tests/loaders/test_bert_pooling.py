"""BERT pooling: mean (GGUF ``pooling_type`` 1, sentence-transformers' mean) equals the mean of transformers'
last hidden state over the tokens; cls, HF's pooler and refused modes pick the nodes they should."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir.reference import evaluate
from uaii.loaders import LoadedModel, LoaderError, load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7], dtype=np.int64)
FEEDS = {"tokens": TOKENS, "positions": np.arange(len(TOKENS), dtype=np.int64),
         "token_types": np.zeros(len(TOKENS), dtype=np.int64)}


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return H.save_tiny("bert", tmp_path_factory.mktemp("pooling") / "bert")


@pytest.fixture(scope="module")
def last_hidden(bert: Path) -> np.ndarray:
    model = transformers.BertModel.from_pretrained(bert, attn_implementation="eager").eval()
    ids = torch.from_numpy(TOKENS)[None]
    with torch.no_grad():
        out = model(ids, token_type_ids=torch.zeros_like(ids))
    return out.last_hidden_state[0].numpy()


def _pooled(m: LoadedModel) -> np.ndarray:
    weights = lambda t: m.weights.read_numpy(t.weight).reshape(t.shape).astype(np.float32)  # noqa: E731
    return evaluate(m.graph, FEEDS, weights)["pooled"]


def _sentence_transformers(bert: Path, out: Path, **pooling: Any) -> Path:
    """A copy of the tiny model laid out as sentence-transformers saves one: modules.json + 1_Pooling/."""
    out.mkdir()
    for f in bert.iterdir():
        (out / f.name).symlink_to(f)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    return out


def test_gguf_mean_pooling_matches_transformers(bert: Path, last_hidden: np.ndarray, tmp_path: Path) -> None:
    path = H.hf_to_gguf(bert, tmp_path / "bert-mean.gguf", "bert", "f32", extra_kv={"bert.pooling_type": 1})[0]
    m = load_model(path)
    assert m.config.pooling == "mean"
    node = m.graph.producers()["pooled"]
    assert node.op == "ReduceMean" and node.get("axes") == (0,) and node.inputs == ("hidden_states",)
    got = _pooled(m)
    assert got.shape == (1, 32)
    np.testing.assert_allclose(got, last_hidden.mean(axis=0, keepdims=True), rtol=1e-4, atol=1e-4)


def test_sentence_transformers_mean_pooling_matches_transformers(bert: Path, last_hidden: np.ndarray,
                                                                 tmp_path: Path) -> None:
    d = _sentence_transformers(bert, tmp_path / "st", pooling_mode_mean_tokens=True, pooling_mode_cls_token=False)
    m = load_model(d)
    assert m.config.pooling == "mean" and m.graph.producers()["pooled"].op == "ReduceMean"
    np.testing.assert_allclose(_pooled(m), last_hidden.mean(axis=0, keepdims=True), rtol=1e-4, atol=1e-4)


def test_sentence_transformers_cls_skips_hf_pooler(bert: Path, last_hidden: np.ndarray, tmp_path: Path) -> None:
    d = _sentence_transformers(bert, tmp_path / "st", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    m = load_model(d)
    assert m.graph.producers()["pooled"].op == "Slice"
    np.testing.assert_allclose(_pooled(m), last_hidden[:1], rtol=1e-4, atol=1e-4)


def test_plain_hf_directory_keeps_the_pooler(bert: Path) -> None:
    m = load_model(bert)
    assert m.config.pooling == "pooler" and m.graph.producers()["pooled"].op == "Tanh"


@pytest.mark.parametrize("modes, name", [({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False},
                                          "'max'"),
                                         ({"pooling_mode_max_tokens": True}, "'mean\\+max'")])
def test_other_sentence_transformers_modes_are_refused(bert: Path, tmp_path: Path, modes: dict[str, bool],
                                                       name: str) -> None:
    d = _sentence_transformers(bert, tmp_path / "st", **modes)
    with pytest.raises(LoaderError, match=f"{name} pooling is not supported"):
        load_model(d)


def test_gguf_last_and_none_pooling(bert: Path, last_hidden: np.ndarray, tmp_path: Path) -> None:
    """llama.cpp's pooling types 3 (last token) and 0 (none: the per-token states are the output) — both used to
    become cls silently."""
    last = load_model(H.hf_to_gguf(bert, tmp_path / "last.gguf", "bert", "f32", extra_kv={"bert.pooling_type": 3})[0])
    assert last.config.pooling == "last" and last.graph.producers()["pooled"].op == "Slice"
    np.testing.assert_allclose(_pooled(last), last_hidden[-1:], rtol=1e-4, atol=1e-4)
    none = load_model(H.hf_to_gguf(bert, tmp_path / "none.gguf", "bert", "f32", extra_kv={"bert.pooling_type": 0})[0])
    assert none.config.pooling == "none" and list(none.graph.outputs) == ["hidden_states"]


@pytest.mark.parametrize("kind, needle", [(4, "rank"), (7, "bert.pooling_type = 7")])
def test_gguf_rank_and_unknown_pooling_are_refused(bert: Path, tmp_path: Path, kind: int, needle: str) -> None:
    path = H.hf_to_gguf(bert, tmp_path / f"p{kind}.gguf", "bert", "f32", extra_kv={"bert.pooling_type": kind})[0]
    with pytest.raises(LoaderError, match=needle):
        load_model(path)
