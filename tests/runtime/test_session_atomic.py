"""All-or-nothing session state: an exception between or inside forward passes (Ctrl-C: KeyboardInterrupt) never
leaves the KV cache holding tokens the history does not know, so the next call answers as a fresh session would.

Regression (issue 11, point 2): the cache was advanced by the pass and the history only after it, so an interrupt
in between left a token in the cache that the next prompt was appended after (wrong positions, a stray token).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from uaii.runtime import SamplingParams, Session
from uaii.runtime.cli.chat import ChatLoop
from uaii.runtime.cli.context import Context

pytest.importorskip("torch")
pytest.importorskip("transformers")

CONFIGS = {
    "unbounded": {"max_batch": 8},
    "window": {"max_batch": 8, "kv_window": 96, "kv_sinks": 2},
    "window-cache-positions": {"max_batch": 8, "kv_window": 96, "kv_sinks": 2, "kv_positions": "cache"},
}
PROMPT = [1, *range(5, 35)]  # 31 tokens: four prefill passes of 8


def interrupt_run(s: Session, at: int, *, before_advance: bool = False) -> Callable[[], int]:
    """From now on, the ``at``-th forward pass raises KeyboardInterrupt: after it ran (the state advanced), or
    inside it, just before the state is advanced. Returns a counter of passes."""
    exe, calls = s._exe, [0]
    real_run = exe.run

    def run(feeds: Any, state: Any = None) -> Any:
        calls[0] += 1
        if calls[0] != at:
            return real_run(feeds, state)
        if before_advance:
            real_advance = state.advance

            def advance(n: int) -> None:
                state.advance = real_advance
                raise KeyboardInterrupt

            state.advance = advance
            return real_run(feeds, state)
        real_run(feeds, state)
        raise KeyboardInterrupt

    exe.run = run
    return lambda: calls[0]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("at, before_advance", [(1, False), (3, False), (7, False), (2, True), (6, True)],
                         ids=["first-chunk", "later-chunk", "decode-step", "inside-chunk", "inside-decode-step"])
def test_an_interrupted_pass_leaves_history_and_cache_in_agreement(tiny: Path, config: str, at: int,
                                                                   before_advance: bool) -> None:
    opts = CONFIGS[config]
    with Session(tiny, **opts) as s, Session(tiny, **opts) as fresh:
        s.generate([1, 5, 6, 7], max_new_tokens=3, ignore_eos=True)  # a first turn: PROMPT[:4] stays cached
        passes = interrupt_run(s, at, before_advance=before_advance)
        with pytest.raises(KeyboardInterrupt):
            s.generate(PROMPT, max_new_tokens=8, ignore_eos=True)
        assert passes() == at
        assert s.kv_length == s._kv.length  # the history says what the cache holds
        del s._exe.run  # back to the class's run
        partial = s.last_result
        assert partial is not None and partial.finish_reason == "stop"
        # the next turn extends what was shown (the chat case): it must be what a fresh session answers
        follow = [*PROMPT, *partial.tokens, 40, 41]
        got = s.generate(follow, max_new_tokens=10, ignore_eos=True)
        want = fresh.generate(follow, max_new_tokens=10, ignore_eos=True)
        assert got.tokens == want.tokens
        assert s.kv_length == s._kv.length == len(follow) + 9


class _Raising(list):  # type: ignore[type-arg]
    """The value arrays of a KV state whose iteration (the compaction's second loop) is interrupted once."""

    def __iter__(self) -> Any:
        raise KeyboardInterrupt


def test_an_interrupted_window_compaction_starts_over_instead_of_mixing_layers(tiny: Path) -> None:
    opts = {"max_batch": 8, "kv_window": 16, "kv_sinks": 2}
    with Session(tiny, **opts) as s, Session(tiny, **opts) as fresh:
        s.generate(PROMPT[:12], max_new_tokens=4, ignore_eos=True)  # 15 of 18 slots used
        kv = s._kv
        values = kv.v
        kv.v = _Raising(values)  # keys move, then the values' loop is interrupted
        with pytest.raises(KeyboardInterrupt):
            s.generate([*PROMPT[:12], 50, 51, 52, 53, 54], max_new_tokens=4, ignore_eos=True)
        kv.v = values
        assert s.kv_length == kv.length == 0  # nothing half-moved is kept: both start over
        follow = [*PROMPT[:20], 44]
        assert s.generate(follow, max_new_tokens=12, ignore_eos=True).tokens == \
            fresh.generate(follow, max_new_tokens=12, ignore_eos=True).tokens


@pytest.mark.parametrize("at", [1, 5], ids=["reading-the-turn", "replying"])
def test_chat_after_ctrl_c_answers_the_next_turn_as_a_fresh_session(talking: Path, monkeypatch: Any,
                                                                    at: int) -> None:
    """`uaii chat` keeps its session after Ctrl-C: the interrupted reply is kept as far as it was shown and the
    next turn is answered from a cache that holds exactly the conversation."""
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    ctx = Context.create(no_color=True)
    gen = {"max_new_tokens": 12, "sampling": SamplingParams(), "ignore_eos": True}
    with Session(talking, max_batch=8) as s, Session(talking, max_batch=8) as fresh:
        loop = ChatLoop(s, ctx, system=None, gen=gen, show_stats=False)
        loop.answer("hello there")
        passes = interrupt_run(s, at)  # the second turn: its first prefill pass, or a decode step
        loop.answer("and now")
        assert passes() == at
        del s._exe.run
        assert s.kv_length == s._kv.length
        assert loop.messages[-1]["role"] == "assistant" and loop.last.finish_reason == "stop"
        loop.answer("again")
        want = fresh.generate(fresh.tokenizer.encode_chat(loop.messages[:-1], add_generation_prompt=True),
                              add_special=False, **gen)
        assert loop.last.tokens == want.tokens
