"""Session option kv_positions: "cache" (StreamingLLM) against a fresh run over the tokens the window keeps, its
validation, and "absolute" as the unchanged default."""

from __future__ import annotations

import json
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.runtime import Session, SessionError, SessionOptions

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer llama (llama3 RoPE scaling): its keys and values depend only on the token and its rotary position,
    so with cache positions the window state equals a fresh run over the tokens it keeps, at positions 0.."""
    import torch

    cfg = {**H.TINY["llama"][2], "num_hidden_layers": 1}
    torch.manual_seed(H.RNG_SEED)
    out = tmp_path_factory.mktemp("kvpos") / "llama1"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval().save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    return out


def test_cache_positions_equal_a_fresh_run_over_the_kept_tokens(one_layer: Path) -> None:
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(3, 64, size=60)]
    with Session(one_layer, kv_window=8, kv_sinks=2, kv_positions="cache", max_batch=4) as s, \
            Session(one_layer) as fresh:
        s.forward(ids[:7])  # a prefill in chunks of max_batch
        history = ids[:7]
        for t in ids[7:]:
            got = s.forward([t])
            history.append(t)
            kept = [history[int(p)] for p in s._kv.pos[:s._kv.used]]
            fresh.reset()
            np.testing.assert_allclose(got, fresh.forward(kept), atol=1e-4)
        assert s._kv.compactions >= 5 and s._kv.used <= 10


def test_absolute_positions_are_the_default_and_differ_after_compaction(tiny: Path) -> None:
    assert SessionOptions().kv_positions == "absolute"
    ids = list(range(3, 33))
    logits = {}
    for mode in (None, "absolute", "cache"):
        kw = {"kv_positions": mode} if mode else {}
        with Session(tiny, kv_window=8, kv_sinks=2, **kw) as s:
            assert s._kv.positions == (mode or "absolute")
            logits[mode] = np.stack([s.forward([t]) for t in ids])
    np.testing.assert_array_equal(logits[None], logits["absolute"])
    np.testing.assert_array_equal(logits["cache"][:10], logits["absolute"][:10])  # before the window slides
    assert np.abs(logits["cache"][10:] - logits["absolute"][10:]).max(axis=1).min() > 1e-6
    with Session(tiny, kv_positions="cache") as c, Session(tiny) as a:  # no window: slots are absolute positions
        for t in ids:
            np.testing.assert_array_equal(c.forward([t]), a.forward([t]))


def test_cache_positions_generate_past_the_window(tiny: Path) -> None:
    with Session(tiny, kv_window=8, kv_sinks=2, kv_positions="cache") as s:
        r = s.generate(list(range(1, 11)), max_new_tokens=40, ignore_eos=True)
        assert len(r.tokens) == 40 and s._kv.compactions > 0
        again = s.generate(list(range(1, 11)), max_new_tokens=40, ignore_eos=True)  # rewinds, then starts over
        assert again.tokens == r.tokens


def test_kv_positions_is_checked(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match=r"kv_positions must be one of 'absolute', 'cache'.*found 'slot'"):
        SessionOptions(kv_positions="slot")
    gpt2 = H.save_tiny("gpt2", tmp_path / "gpt2")
    with pytest.raises(SessionError, match=r"kv_positions='cache' does not apply to .*keys must come from a RoPE"):
        Session(gpt2, kv_window=8, kv_positions="cache")
    bert = H.save_tiny("bert", tmp_path / "bert")
    with pytest.raises(SessionError, match="kv_positions='cache' needs a decoder with a KV cache"):
        Session(bert, kv_positions="cache")
