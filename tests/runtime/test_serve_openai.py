"""`uaii serve` driven by the official ``openai`` client on SmolLM2: chat and completions, streaming and not, the
usage chunk of ``stream_options.include_usage``, logprobs, /v1/models, /tokenize, /health and /metrics."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_support import running_server  # noqa: E402

OPTIONS = {"max_context": 256}
CHAT = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def url(smollm2_path: Path) -> Iterator[str]:
    with running_server(model=smollm2_path, session_options=OPTIONS) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models_lists_the_loaded_model(client: openai.OpenAI, smollm2_path: Path) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [smollm2_path.stem]
    assert models[0].object == "model"


def test_chat_not_streamed(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == model
    assert r.system_fingerprint and r.created > 0
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    assert r.usage is not None and r.usage.completion_tokens <= 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streamed_equals_not_streamed(client: openai.OpenAI, model: str) -> None:
    """Greedy: the streamed pieces join to the same text as the one-body reply; the role comes first."""
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_include_usage_adds_one_last_chunk(client: openai.OpenAI, model: str) -> None:
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=5, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    pieces = sum(1 for c in body if c.choices and c.choices[0].delta.content)
    assert 1 <= pieces <= last.usage.completion_tokens  # a piece per token, but none while a character is partial
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in body)
    assert 1 <= last.usage.completion_tokens <= 5


def test_chat_logprobs(client: openai.OpenAI, model: str) -> None:
    """The chosen token's logprob with the top 3, sorted, the greedy choice being the top one."""
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(item.token for item in content) == r.choices[0].message.content
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert item.logprob <= 0 and math.isclose(item.logprob, tops[0], abs_tol=1e-9)
        assert item.token == item.top_logprobs[0].token and bytes(item.bytes).decode() == item.token


def test_completions_with_logprobs(client: openai.OpenAI, model: str) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
    assert r.object == "text_completion"
    choice = r.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == r.usage.completion_tokens
    assert lp.text_offset[0] == len(prompt)
    assert all(len(top) <= 2 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs,
                                                                                        lp.token_logprobs,
                                                                                        strict=True))
    assert "Paris" in choice.text


def test_completions_streamed(client: openai.OpenAI, model: str) -> None:
    whole = client.completions.create(model=model, prompt="One, two,", max_tokens=6, temperature=0)
    chunks = list(client.completions.create(model=model, prompt="One, two,", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_and_seed(client: openai.OpenAI, model: str) -> None:
    """A stop string ends the text before it; the same seed gives the same sampled reply."""
    free = client.completions.create(model=model, prompt="One, two, three,", max_tokens=8, temperature=0)
    text = free.choices[0].text
    cut = text.strip()[:2]
    stopped = client.completions.create(model=model, prompt="One, two, three,", max_tokens=8, temperature=0,
                                        stop=[cut])
    assert stopped.choices[0].finish_reason == "stop" and cut not in stopped.choices[0].text
    assert text.startswith(stopped.choices[0].text)
    a, b = (client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, temperature=1.0, seed=7)
            for _ in range(2))
    assert a.choices[0].message.content == b.choices[0].message.content


def test_tokenize_detokenize_health_metrics(url: str) -> None:
    ids = httpx.post(f"{url}/tokenize", json={"content": "hello world", "add_special": False}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    assert httpx.post(f"{url}/detokenize", json={"tokens": ids}).json() == {"content": "hello world"}
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
    page = httpx.get(f"{url}/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    lines = page.text.splitlines()
    for name in ("uaii_prompt_tokens_total", "uaii_completion_tokens_total", "uaii_decode_tokens_per_second",
                 "uaii_bytes_read_per_token", "uaii_read_gigabytes_per_second", "uaii_expert_cache_hits_total",
                 "uaii_sequences_active", "uaii_sequences_queued", "uaii_process_resident_memory_bytes"):
        assert any(line.startswith(name + " ") for line in lines), name
    assert any(line.startswith('uaii_http_requests_total{route="/tokenize",status="200"}') for line in lines)
    completion = next(line for line in lines if line.startswith("uaii_completion_tokens_total "))
    assert float(completion.split()[1]) > 0


def test_models_retrieve(client: openai.OpenAI, model: str) -> None:
    """``client.models.retrieve``: GET /v1/models/{id}; another name is 404 model_not_found."""
    found = client.models.retrieve(model)
    assert (found.id, found.object, found.owned_by) == (model, "model", "uaii") and found.created > 0
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("../" + model)


def test_text_offset_of_a_prompt_in_a_list(client: openai.OpenAI, model: str) -> None:
    """A prompt sent as a list of one text counts its offsets from that text's start, as a plain prompt does."""
    prompt = "The capital of France is"
    plain = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0, logprobs=1)
    listed = client.completions.create(model=model, prompt=[prompt], max_tokens=3, temperature=0, logprobs=1)
    assert listed.choices[0].logprobs.text_offset == plain.choices[0].logprobs.text_offset
    assert listed.choices[0].logprobs.text_offset[0] == len(prompt)
