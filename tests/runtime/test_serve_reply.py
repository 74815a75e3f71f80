"""Reply.text_frame (the per-token SSE data made from a template) is byte for byte the JSON of the chunk dict the
general path builds, for any text, for chat and for completions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'uaii-runtime[serve]'")

from uaii.runtime.serve.reply import Reply

SESSION = SimpleNamespace(tokenizer=None)


@pytest.mark.parametrize("kind", ["chat", "text"])
@given(text=st.text(min_size=1))
def test_text_frame_is_the_chunk_json(kind: str, text: str) -> None:
    reply = Reply(kind, 'model "q"\\x', SESSION, logprobs=False, include_usage=True)
    event = SimpleNamespace(token_id=7, text=text, finish_reason=None, logprob=None, usage=None)
    (chunk,) = reply.chunks(event)
    assert reply.text_frame(text) == json.dumps(chunk)
    assert reply.chunk_texts(event) == [json.dumps(chunk)]  # the path the stream takes
    assert json.loads(reply.text_frame(text))["choices"][0]["delta" if kind == "chat" else "text"] == (
        {"content": text} if kind == "chat" else text)
