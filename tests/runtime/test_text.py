"""Text-level generation on SmolLM2 (the real model of the test fixtures): tokenize/detokenize, streaming, stop
strings, chat templates, EOS."""

from __future__ import annotations

from pathlib import Path

import pytest

from uaii.runtime import Session
from uaii.runtime.generate import TextStream


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Session:
    with Session(smollm2_path) as s:
        yield s


def test_tokens_round_trip(smol: Session) -> None:
    ids = smol.tokenize("Hello, world!")
    assert ids and smol.detokenize(ids) == "Hello, world!"
    assert smol.tokenizer is not None and smol.model_info is not None and smol.model_info.arch == "llama"


def test_stream_joins_to_the_result_and_stop_strings_are_cut(smol: Session) -> None:
    pieces = list(smol.stream("The capital of France is", max_new_tokens=24))
    r = smol.last_result
    assert r is not None and "".join(pieces) == r.text and len(pieces) > 3 and "Paris" in r.text
    cut = smol.generate("The capital of France is", max_new_tokens=24, stop=["\n"])
    assert cut.finish_reason == "stop" and "\n" not in cut.text and r.text.startswith(cut.text)
    streamed = "".join(smol.stream("The capital of France is", max_new_tokens=24, stop=["France."]))
    assert "France." not in streamed


def test_chat_ends_at_the_end_of_turn(smol: Session) -> None:
    r = smol.chat([{"role": "user", "content": "Say hello."}], max_new_tokens=64)
    assert r.finish_reason == "eos" and r.text.strip() and r.tokens
    assert not set(r.tokens) & set(smol._bundle.stop_ids)
    longer = smol.chat([{"role": "user", "content": "Say hello."}], max_new_tokens=8, ignore_eos=True)
    assert longer.finish_reason == "length" and len(longer.tokens) == 8


class _Chars:
    """A tokenizer whose ids are characters, for the stop-string window."""

    def stream(self) -> object:
        class D:
            def step(self, i: int) -> str:
                return chr(i)

            def finish(self) -> str:
                return ""
        return D()


def test_stop_strings_across_pieces() -> None:
    ts = TextStream(_Chars(), ["<END>", "xyz"])
    out = "".join(ts.push(ord(c)) for c in "hello <EN")
    assert out == "hello " and not ts.stopped  # "<EN" held back: it could start "<END>"
    out += "".join(ts.push(ord(c)) for c in "D> tail")
    assert ts.stopped and out + ts.finish() == "hello " and ts.text == "hello "
    ts = TextStream(_Chars(), ["<END>"])
    text = "".join(ts.push(ord(c)) for c in "no stop <E") + ts.finish()
    assert text == "no stop <E" and not ts.stopped


def test_only_a_possible_stop_start_is_held_back() -> None:
    """A long stop string does not delay text that cannot begin it (llama.cpp's partial-stop rule)."""
    ts = TextStream(_Chars(), ["\nObservation:"])
    assert [ts.push(ord(c)) for c in "Hi there"] == list("Hi there")  # each character at once
    assert ts.push(ord("\n")) == "" and ts.push(ord("O")) == ""  # "\nO" may grow into the stop
    assert ts.push(ord("k")) == "\nOk" and not ts.stopped  # it did not: released together
    out = "".join(ts.push(ord(c)) for c in " then\nObs")
    assert out == " then" and not ts.stopped  # a stop split across tokens is held back ...
    out += "".join(ts.push(ord(c)) for c in "ervation: x")
    assert ts.stopped and out == " then" and ts.text == "Hi there\nOk then"  # ... and cut
    ts = TextStream(_Chars(), ["abc", "bd"])
    assert ts.push(ord("a")) == "" and ts.push(ord("b")) == ""  # "ab" may start "abc", "b" may start "bd"
    assert ts.push(ord("x")) == "abx"
    assert "".join(ts.push(ord(c)) for c in "ab") == "" and ts.push(ord("d")) == "a" and ts.stopped  # "bd" cut


def test_session_stream_with_a_long_stop_does_not_lag(smol: Session) -> None:
    plain = list(smol.stream("The capital of France is", max_new_tokens=12))
    assert "".join(plain).startswith(" Paris.\n")  # the fixture model's greedy reply; a "\n" comes third
    held = list(smol.stream("The capital of France is", max_new_tokens=12, stop=["\nObservation:"]))
    assert held[:2] == plain[:2] == [" Paris", "."]  # nothing held back before the "\n"
    assert "".join(held) == "".join(plain)  # no stop in the reply: all of it comes out


def test_a_stream_closed_early_leaves_a_result(smol: Session) -> None:
    it = smol.stream("Once upon a time", max_new_tokens=50)
    first = next(it)
    it.close()
    r = smol.last_result
    assert r is not None and r.finish_reason == "stop" and r.text.startswith(first) and 0 < len(r.tokens) < 50
