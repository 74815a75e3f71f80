"""Generation is bounded by the model's context, the same in every preset: a window bounds memory, not positions.

Regressions (issue 11, point 5): with the CLI's 2048-token window, `-n 10**9` on a 128-context model never
stopped, a prompt longer than the context ran (for minutes on a real model) instead of being refused, and GPT-2
(learned positions) died mid-answer with `kernel status -2` once its positions passed n_positions.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import loader_helpers as H
import pytest
from rich.console import Console

from uaii.runtime import SamplingParams, Session, SessionError
from uaii.runtime.cli import main
from uaii.runtime.cli.chat import ChatLoop
from uaii.runtime.cli.context import Context
from uaii.runtime.cli.generate import PrefillProgress

pytest.importorskip("torch")
pytest.importorskip("transformers")

CONTEXT = 128  # the tiny models' max_position_embeddings / n_positions


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return H.save_tiny("gpt2", tmp_path_factory.mktemp("bounds") / "gpt2")


@pytest.fixture(autouse=True)
def _cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("UAII_DEBUG", raising=False)


def record_positions(s: Session) -> list[int]:
    """The largest position fed to each forward pass of ``s`` from now on."""
    seen: list[int] = []
    real = s._exe.run

    def run(feeds: Any, state: Any = None) -> Any:
        seen.append(int(feeds["positions"].max()))
        return real(feeds, state)

    s._exe.run = run
    return seen


def bounded(limit: int) -> Any:
    """An on_token that fails the test (instead of running for ever) once ``limit`` tokens were generated."""
    count = [0]

    def on_token(token: int, piece: str) -> None:
        count[0] += 1
        assert count[0] <= limit, f"generation went on past {limit} tokens"

    return on_token


@pytest.mark.parametrize("model", ["tiny", "gpt2"])
def test_generation_stops_at_the_context_whatever_the_window(model: str, request: pytest.FixtureRequest,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """-n 10**9 with the CLI's 2048-token window: finish "length" at the context, positions below it; GPT-2's
    learned positions end cleanly instead of a kernel status."""
    path = request.getfixturevalue(model)
    prompt = [1, 5, 9]
    with caplog.at_level(logging.WARNING, "uaii"), Session(path, kv_window=2048) as s:
        seen = record_positions(s)
        r = s.generate(prompt, max_new_tokens=10**9, ignore_eos=True, on_token=bounded(2 * CONTEXT))
        assert r.finish_reason == "length" and len(r.tokens) == CONTEXT - len(prompt) + 1
        assert max(seen) == CONTEXT - 1 and s.kv_length == CONTEXT
        again = s.generate([*prompt, *r.tokens[:5]], max_new_tokens=10**9, ignore_eos=True,
                           on_token=bounded(2 * CONTEXT))
        assert again.finish_reason == "length" and max(seen) == CONTEXT - 1
    assert caplog.text.count("generation stopped at the context of 128 tokens") == 1  # said once
    assert ("kv_positions='cache' lets a window slide past it" in caplog.text) == (model == "tiny")  # RoPE only


@pytest.mark.parametrize("options", [{}, {"kv_window": 2048}, {"preset": "auto"}, {"preset": "unlimited"},
                                     {"kv_window": 32, "kv_sinks": 2, "max_batch": 16}])
def test_a_prompt_longer_than_the_context_is_refused_before_any_pass(tiny: Path, options: dict[str, Any]) -> None:
    with Session(tiny, **options) as s:
        seen = record_positions(s)
        with pytest.raises(SessionError, match=r"200 tokens do not fit the context: it holds 128 tokens and 0 are "
                                               r"used \(llama\); shorten the prompt, or slide a window over it"):
            s.generate([1 + i % 60 for i in range(200)], max_new_tokens=4)
        assert seen == [] and s.kv_length == 0


def test_learned_positions_refuse_more_and_cap_max_context(gpt2: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "uaii"), Session(gpt2, max_context=4096, kv_window=2048) as s:
        assert s.context == s.trained_context == CONTEXT and not s.has_rope
        with pytest.raises(SessionError, match=r"129 tokens do not fit .* positions are learned"):
            s.forward([1 + i % 60 for i in range(129)])
        s.forward([1 + i % 60 for i in range(100)])
        with pytest.raises(SessionError, match=r"29 tokens do not fit the context: it holds 128 tokens and 100"):
            s.forward(list(range(1, 30)))
        assert s.kv_length == 100
    assert "max_context=4096 is more than the 128 positions" in caplog.text


def test_cache_positions_slide_past_the_context_and_say_so(tiny: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "uaii"), \
            Session(tiny, kv_window=2048, kv_sinks=4, kv_positions="cache", max_batch=64) as s:
        assert s.slides and s.options.kv_window == CONTEXT - 4 and s._kv.capacity == CONTEXT  # cut to the context
        seen = record_positions(s)
        r = s.generate([1, 5, 9], max_new_tokens=400, ignore_eos=True)
        assert len(r.tokens) == 400 and r.finish_reason == "length" and max(seen) < CONTEXT
        assert caplog.text.count("passes the context of 128 tokens") == 1
        long = [2 + i % 60 for i in range(300)]  # longer than the context: windowed, with a warning
        r = s.generate(long, max_new_tokens=4, ignore_eos=True)
        assert len(r.tokens) == 4 and max(seen) < CONTEXT and s.kv_length == 303
    assert "300 new tokens are more than the context of 128" in caplog.text


def test_prefill_progress_is_reported_per_pass(tiny: Path) -> None:
    calls: list[tuple[int, int]] = []
    with Session(tiny, max_batch=16) as s:
        s.generate(list(range(1, 41)), max_new_tokens=1, on_prefill=lambda d, t: calls.append((d, t)))
        assert calls == [(0, 40), (16, 40), (32, 40), (40, 40)]
        calls.clear()
        s.reset()
        s.generate(list(range(1, 11)), max_new_tokens=1, on_prefill=lambda d, t: calls.append((d, t)))
        assert calls == []  # one pass: nothing to report


def test_progress_bar_in_a_terminal_and_a_note_elsewhere() -> None:
    term = io.StringIO()
    ctx = Context(Console(file=io.StringIO()), Console(file=term, force_terminal=True, width=80), Session, False)
    bar = PrefillProgress(ctx)
    bar(0, 5000)
    bar(2500, 5000)
    assert bar._bar is not None and "prefill" in term.getvalue()
    bar(5000, 5000)
    assert bar._bar is None  # removed when the prefill ends
    plain = io.StringIO()
    quiet = PrefillProgress(Context(Console(file=io.StringIO()), Console(file=plain), Session, True))
    quiet(0, 1000)
    assert plain.getvalue() == ""  # short: nothing in a log
    quiet(0, 5000)
    assert plain.getvalue() == "(prefill of 5000 prompt tokens ...)\n"


# ------------------------------------------------------------------------------------------ the command line
def test_cli_default_preset_stops_at_the_context(talking: Path, tmp_path: Path) -> None:
    """`uaii run -n 1000000000` in the default preset ends (a subprocess: it ran for ever before)."""
    proc = subprocess.run([sys.executable, "-m", "uaii.runtime.cli", "run", str(talking), "-p", "hello",
                           "-n", "1000000000", "--threads", "1"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "UAII_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert "(length)" in proc.stderr and "preset auto" in proc.stderr
    assert "warning: [runtime] generation stopped at the context of 128 tokens" in proc.stderr


@pytest.mark.parametrize("preset", ["auto", "unlimited", "tiny"])
def test_cli_refuses_a_prompt_longer_than_the_context_at_once(talking: Path, preset: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(talking), "-p", "ab " * 100, "--preset", preset])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.count("\n") == 1
    n = len(chat_gguf_tokens(talking, "ab " * 100))
    assert err.startswith(f"error: [runtime] {n} tokens do not fit the context: it holds 128 tokens and 0 are used")


def test_cli_long_prefill_with_cache_positions_is_windowed_with_a_note(talking: Path, capsys: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "uaii"):
        code = main(["run", str(talking), "-p", "ab " * 1400, "-n", "3", "--kv-positions", "cache"])
    _, err = capsys.readouterr()
    assert code == 0, err
    n = len(chat_gguf_tokens(talking, "ab " * 1400))
    assert n > PrefillProgress.NOTE_TOKENS and f"(prefill of {n} prompt tokens ...)" in err and "(length)" in err
    assert f"{n} new tokens are more than the context of 128" in caplog.text


def chat_gguf_tokens(path: Path, text: str) -> list[int]:
    with Session(path) as s:
        return s.tokenize(text)


def test_chat_says_when_the_conversation_outgrows_the_context(talking: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    err = io.StringIO()
    ctx = Context(Console(file=io.StringIO()), Console(file=err), Session, True)
    with Session(talking, kv_window=2048) as s:
        loop = ChatLoop(s, ctx, system=None, show_stats=False,
                        gen={"max_new_tokens": 8, "sampling": SamplingParams(), "ignore_eos": True})
        loop.answer("hi")
        before = list(loop.messages)
        loop.answer("ab " * 50)
        assert loop.messages == before and "more than the model's context of 128: /reset starts over" in err.getvalue()
        loop.answer("ok")
        assert loop.last.tokens and loop.messages[-2] == {"role": "user", "content": "ok"}
