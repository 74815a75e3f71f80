"""Session lifecycle, options, errors and the generation loop, on tiny models built by the tests themselves."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pytest

from uaii.ir import DType, Node, Tensor, WeightRef, make_graph, save, validate
from uaii.runtime import GenerationResult, SamplingParams, Session, SessionError, SessionOptions, SessionState
from uaii.runtime.budget import kv_cache_bytes

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A non-generative .uaii.json graph whose weight is a raw file beside it."""
    root = tmp_path_factory.mktemp("mlp")
    w = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    (root / "w.bin").write_bytes(w.tobytes())
    g = make_graph("mlp", [Node("mm", "MatMul", ("x", "w"), ("h",), {"transpose_b": True}),
                           Node("relu", "Relu", ("h",), ("y",))],
                   [Tensor("x", DType.F32, ("batch", 8)), Tensor("w", DType.F32, (4, 8), weight=WeightRef("w.bin")),
                    Tensor("h", DType.F32, ("batch", 4)), Tensor("y", DType.F32, ("batch", 4))], ["x"], ["y"])
    path = root / "mlp.uaii.json"
    save(g, path)
    return path


def test_options_are_checked() -> None:
    with pytest.raises(SessionError, match=r"unknown Session option.*'max_batc'.*valid options: device, n_threads"):
        SessionOptions.from_kwargs({"max_batc": 4})
    for bad in ({"max_batch": 0}, {"device": ""}, {"kv_window": -1}, {"enable_fusion": "yes"}, {"n_threads": 0}):
        with pytest.raises(SessionError):
            SessionOptions.from_kwargs(bad)
    o = SessionOptions()
    assert (o.device, o.kv_window, o.budget_bytes, o.preset, o.max_batch) == ("cpu", 0, 0, None, 512)
    p = SessionOptions.from_kwargs({"preset": "tiny", "kv_window": 64})
    assert p.budget_bytes == 256 << 20 and p.kv_window == 64 and p.kv_sinks == 4  # explicit options win
    assert p.kv_dtype == "f16" and o.kv_dtype == "f32"          # a preset's f16 cache; none: the exact f32 one
    assert SessionOptions.from_kwargs({"preset": "tiny", "kv_dtype": "f32"}).kv_dtype == "f32"


def test_the_cli_offers_the_gemm_modes_the_option_takes() -> None:
    """--gemm spells out uaii.backends.config.GEMM_MODES (importing it would load the native kernels to build the
    parser of every command): the two lists must not drift apart."""
    from uaii.backends.config import GEMM_MODES
    from uaii.runtime.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in ("run", "chat", "bench"):
        (gemm,) = [a for a in commands.choices[name]._actions if a.dest == "gemm"]
        assert tuple(gemm.choices) == GEMM_MODES, name


def test_lifecycle_and_misuse(tiny: Path) -> None:
    s = Session(tiny, plan_cache=False)
    assert s.state is SessionState.READY and s.load_s > 0
    assert s.model_info is not None and s.model_info.arch == "llama" and s.model_info.n_params > 0
    assert validate(s.graph) == [] and s.graph.tensor("logits").shape == (1, 64)  # lm_head on the last row only
    s.close()
    s.close()  # idempotent
    assert s.state is SessionState.CLOSED
    for call in (lambda: s.generate([1, 2]), lambda: s.forward([1]), lambda: s.reset(), lambda: s.run({})):
        with pytest.raises(SessionError, match="the session is closed"):
            call()
    with Session(tiny) as s2:
        with pytest.raises(SessionError, match="has no tokenizer"):
            s2.tokenize("hi")
        with pytest.raises(SessionError, match="empty"):
            s2.generate([])
        with pytest.raises(SessionError, match=r"token ids must be in \[0, 64\)"):
            s2.forward([99])
    assert s2.state is SessionState.CLOSED
    with pytest.raises(SessionError, match="no such file"):
        Session(tiny / "missing.gguf")


def test_generation_result_and_stats(tiny: Path) -> None:
    with Session(tiny) as s:
        r = s.generate([1, 5, 9, 3], max_new_tokens=12, ignore_eos=True)
        assert isinstance(r, GenerationResult) and r.finish_reason == "length"
        assert len(r.tokens) == 12 and r.prompt_tokens == [1, 5, 9, 3] and r.text == ""
        st = r.stats
        assert st.prompt_tokens == 4 and st.new_tokens == 12 and st.ttft_s > 0 and st.prefill_tok_s > 0
        assert st.decode_tok_s > 0 and st.peak_rss_bytes > 10 << 20 and st.bytes_read_per_token > 0
        assert set(st.to_dict()) >= {"prompt_tokens", "new_tokens", "ttft_s", "prefill_s", "prefill_tok_s",
                                     "decode_s", "decode_tok_s", "peak_rss_bytes", "load_s", "plan_cache_hit",
                                     "bytes_read_per_token"}
        # greedy generation is the argmax of forward() at every step
        s.reset()
        logits = s.forward([1, 5, 9, 3])
        expect = []
        for _ in range(12):
            expect.append(int(np.argmax(logits)))
            logits = s.forward([expect[-1]])
        assert expect == r.tokens
        # a stop id ends generation without being part of the output
        s.reset()
        cut = s.generate([1, 5, 9, 3], max_new_tokens=12, stop_token_ids=[r.tokens[5]], ignore_eos=True)
        assert cut.finish_reason == "stop" and cut.tokens == r.tokens[:r.tokens.index(r.tokens[5])]
        assert s.generate([1, 5], max_new_tokens=0).tokens == []


def test_prefill_chunks_and_prompt_reuse(tiny: Path) -> None:
    prompt = [1, *range(3, 40)]
    with Session(tiny, max_batch=5) as small, Session(tiny) as big:
        np.testing.assert_allclose(small.forward(prompt), big.forward(prompt), atol=1e-5)
        assert small.kv_length == big.kv_length == len(prompt)
        a = big.generate(prompt, max_new_tokens=6, ignore_eos=True)
        b = big.generate(prompt, max_new_tokens=6, ignore_eos=True)
        assert b.stats.cached_tokens == len(prompt) and b.tokens == a.tokens     # the kept prefill logits
        c = big.generate(prompt[:-1], max_new_tokens=6, ignore_eos=True)        # a shorter prompt: re-fed
        assert c.stats.cached_tokens == len(prompt) - 2
        big.reset()
        assert big.kv_length == 0


def test_a_repeated_prompt_draws_what_a_fresh_session_draws(tiny: Path) -> None:
    """Regression: the second call re-fed the last prompt token alone (the decode path), whose logits differ in
    the last bits from the batched prefill's, so a seeded sampled draw could differ from a fresh session's."""
    prompt = [1, *range(3, 30)]
    params = SamplingParams(temperature=1.5, seed=3)
    with Session(tiny) as fresh:
        expected = fresh.generate(prompt, max_new_tokens=8, sampling=params, ignore_eos=True)
        first_logits = fresh._prompt_logits
    with Session(tiny) as s:
        s.generate(prompt, max_new_tokens=8, sampling=params, ignore_eos=True)
        s.forward([7, 8, 9])                                                     # more tokens after it
        again = s.generate(prompt, max_new_tokens=8, sampling=params, ignore_eos=True)
        assert again.stats.cached_tokens == len(prompt) and again.tokens == expected.tokens
        assert first_logits is not None and s._prompt_logits is not None
        np.testing.assert_array_equal(s._prompt_logits[1], first_logits[1])
        s.generate(prompt[:10], max_new_tokens=2, ignore_eos=True)               # rewinds below the prompt:
        assert s._prompt_logits is not None and s._prompt_logits[0] == 10        # its logits are dropped


def test_context_limit_and_window(tiny: Path) -> None:
    with Session(tiny, max_context=16) as s:
        with pytest.raises(SessionError, match="17 tokens do not fit the context: it holds 16"):
            s.forward(list(range(1, 18)))
        r = s.generate(list(range(1, 11)), max_new_tokens=20, ignore_eos=True)
        assert r.finish_reason == "length" and len(r.tokens) == 7  # 10 prompt + 6 fed + the last sampled
    with Session(tiny, kv_window=8, kv_sinks=2) as w:
        r = w.generate(list(range(1, 11)), max_new_tokens=40, ignore_eos=True)
        assert len(r.tokens) == 40 and w._kv.compactions > 0


def test_run_on_graphs(tiny: Path, mlp: Path) -> None:
    with Session(mlp) as s:
        x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
        w = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
        np.testing.assert_allclose(s.run({"x": x})["y"], np.maximum(x @ w.T, 0), rtol=1e-5, atol=1e-6)
        with pytest.raises(SessionError, match="missing input"):
            s.run({})
        with pytest.raises(SessionError, match="not a generative model"):
            s.generate([1])
        assert s.model_info is not None and s.model_info.format == "uaii"
    with Session(tiny) as s:  # a decoder LM through run(): the functional graph, every row of logits
        ids = np.array([1, 7, 3, 9])
        feeds = {"tokens": ids, "positions": np.arange(4)}
        feeds |= {n: np.zeros((0, 2, 8), np.float32) for n in s._bundle.graph.inputs if n.startswith("past_")}
        rows = s.run(feeds)["logits"]
        assert rows.shape == (4, 64)
        np.testing.assert_allclose(rows[-1], s.forward(ids.tolist()), atol=1e-5)


def test_presets_and_auto_device(tiny: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING), Session(tiny, device="auto", preset="laptop") as s:
        assert s.backend.name == "cpu"
        assert s.options.budget_bytes == 2 << 30 and s.options.kv_window == 2048
        # the tiny llama's context is 128 positions: a 2048-token window never slides there, so the cache is the
        # context's (it was 2052 slots, 16x the bytes, before planning.windowed)
        assert s.context == 128 and s._kv.capacity == 128 and s.plan.storage.kv_cache_bytes == \
            kv_cache_bytes(s.graph, 128, s.options.kv_dtype)
        assert s.generate([1, 2, 3], max_new_tokens=3, ignore_eos=True).tokens
        # the preset's budget is enforced: a streaming store, and the tiny model fits it pinned (nothing streams)
        assert s.storage_stats()["mode"] == "streaming" and not s.streaming
        assert {w.mode for w in s.plan.storage.weights} == {"pinned"}
    assert "falling back to cpu" in caplog.text and "not implemented" not in caplog.text
