"""Session.run on an encoder (BERT) against transformers, and the disk plan cache across sessions."""

from __future__ import annotations

from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.planner import PlanCache
from uaii.runtime import Session

TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7], dtype=np.int64)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(cache))
    return cache


def test_bert_run_matches_transformers(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = H.save_tiny("bert", tmp_path / "bert")
    model = transformers.BertModel.from_pretrained(d, attn_implementation="eager").eval()
    ids = torch.from_numpy(TOKENS)[None]
    with torch.no_grad():
        want = model(ids, token_type_ids=torch.zeros_like(ids))
    feeds = {"tokens": TOKENS, "positions": np.arange(len(TOKENS), dtype=np.int64),
             "token_types": np.zeros(len(TOKENS), dtype=np.int64)}
    with Session(d) as s:
        got = s.run(feeds)
    np.testing.assert_allclose(got["hidden_states"], want.last_hidden_state[0].numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["pooled"], want.pooler_output.numpy(), rtol=1e-4, atol=1e-4)


def test_bert_mean_pooling_runs_on_the_cpu_backend(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    d = H.save_tiny("bert", tmp_path / "bert")
    gguf = H.hf_to_gguf(d, tmp_path / "bert-mean.gguf", "bert", "f32", extra_kv={"bert.pooling_type": 1})[0]
    model = transformers.BertModel.from_pretrained(d, attn_implementation="eager").eval()
    ids = torch.from_numpy(TOKENS)[None]
    with torch.no_grad():
        want = model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state[0].numpy().mean(0, keepdims=True)
    feeds = {"tokens": TOKENS, "positions": np.arange(len(TOKENS), dtype=np.int64),
             "token_types": np.zeros(len(TOKENS), dtype=np.int64)}
    with Session(gguf) as s:
        got = s.run(feeds)
    np.testing.assert_allclose(got["pooled"], want, rtol=1e-4, atol=1e-4)


def test_second_session_of_a_model_skips_planning(tmp_path: Path, _private_cache: Path) -> None:
    pytest.importorskip("torch")
    d = H.save_tiny("llama", tmp_path / "llama")
    with Session(d, max_context=64) as first:
        assert first.plan_cache_hit is False
        a = first.generate([1, 2, 3], max_new_tokens=4).tokens
    status = PlanCache().status()
    assert status.entries >= 1 and status.total_bytes > 0
    with Session(d, max_context=64) as second:
        assert second.plan_cache_hit is True
        r = second.generate([1, 2, 3], max_new_tokens=4)
    assert r.stats.plan_cache_hit is True
    assert r.tokens == a
    # A corrupt entry is rebuilt, not trusted.
    for f in Path(status.path).glob("*.json"):
        f.write_text("{not json")
    with Session(d, max_context=64) as third:
        assert third.plan_cache_hit is False
        assert third.generate([1, 2, 3], max_new_tokens=4).tokens == a
