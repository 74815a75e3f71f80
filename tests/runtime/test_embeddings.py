"""Session.embed: an encoder's pooled output (tiny BERT against transformers), a decoder's mean final hidden state
(SmolLM2 against the reference evaluator on the rewritten graph), unit norm, inputs checked before anything runs,
and the conversation cache left alone; POST /v1/embeddings with the openai client, its refusals, and beside a
chat stream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir import check
from uaii.ir.reference import evaluate
from uaii.loaders import load_model
from uaii.runtime import Session, SessionError
from uaii.runtime.embedding import EmbeddingError
from uaii.runtime.rewrite import hidden_state_output

TOKENS = [3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7]
TEXTS = ["The capital of France is Paris.", "def square(x):\n    return x * x"]


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(-1)
    return x / np.linalg.norm(x)


def _weights(model: Any) -> Any:
    """Reference-evaluator weights of a loaded model: plain dtypes as they are, GGUF blocks dequantized by gguf."""
    import gguf

    def read(t: Any) -> np.ndarray:
        info = model.weights[t.weight]
        raw = np.frombuffer(model.weights.read_bytes(t.weight), np.uint8)
        if info.dtype.is_quantized:
            q = gguf.GGMLQuantizationType[info.dtype.name.upper()]
            return gguf.quants.dequantize(raw.reshape(*info.shape[:-1], -1), q).reshape(t.shape).astype(np.float32)
        return raw.view(info.dtype.numpy).reshape(t.shape).astype(np.float32)
    return read


def _functional_feeds(graph: Any, ids: list[int]) -> dict[str, np.ndarray]:
    feeds = {"tokens": np.asarray(ids, np.int64), "positions": np.arange(len(ids), dtype=np.int64)}
    for name in graph.inputs:
        if name.startswith("past_"):
            feeds[name] = np.zeros((0, *graph.tensor(name).shape[1:]), np.float32)
    return feeds


# --- the rewrite -----------------------------------------------------------------------------------------------
def test_hidden_state_output_is_the_lm_head_input(tiny: Path) -> None:
    """The rewritten graph validates, has no lm_head any more, and its hidden states times the head's weight are
    the original graph's logits (reference evaluator, f32 weights)."""
    m = load_model(tiny)
    g = hidden_state_output(m.graph)
    check(g)
    assert g.outputs[0] == "hidden_states" and "logits" not in g.tensor_map
    assert g.outputs[1:] == tuple(o for o in m.graph.outputs if o != "logits")
    head = m.graph.producers()["logits"]
    weights = _weights(m)
    feeds = _functional_feeds(m.graph, TOKENS)
    hidden = evaluate(g, feeds, weights)["hidden_states"]
    logits = evaluate(m.graph, feeds, weights)["logits"]
    w = weights(m.graph.tensor(head.inputs[1]))
    assert hidden.shape == (len(TOKENS), m.config.d_model)
    np.testing.assert_allclose(hidden @ (w.T if head.get("transpose_b") else w), logits, rtol=1e-4, atol=1e-4)


def test_hidden_state_output_refuses_a_graph_without_a_head(tiny: Path) -> None:
    m = load_model(tiny)
    with pytest.raises(SessionError, match="no lm_head found"):
        hidden_state_output(m.graph, output="present_k.0")


# --- encoders --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    return H.save_tiny("bert", tmp_path_factory.mktemp("embed") / "bert")


@pytest.fixture(scope="module")
def bert_reference(bert: Path) -> dict[str, np.ndarray]:
    """transformers' pooler output and mean last hidden state of TOKENS (one segment)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel.from_pretrained(bert, attn_implementation="eager").eval()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        out = model(ids, token_type_ids=torch.zeros_like(ids))
    return {"pooler": out.pooler_output[0].numpy(), "mean": out.last_hidden_state[0].numpy().mean(axis=0)}


def test_bert_pooler_matches_transformers(bert: Path, bert_reference: dict[str, np.ndarray]) -> None:
    with Session(bert, plan_cache=False) as s:
        got = s.embed([TOKENS, TOKENS[:5]])
    assert got.shape == (2, 32) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(got[0], _unit(bert_reference["pooler"]), rtol=1e-4, atol=1e-5)
    assert not np.array_equal(got[0], got[1])  # another input, another vector (a random pooler is nearly constant)


def test_bert_gguf_mean_pooling_matches_transformers(bert: Path, bert_reference: dict[str, np.ndarray],
                                                    tmp_path: Path) -> None:
    path = H.hf_to_gguf(bert, tmp_path / "bert-mean.gguf", "bert", "f32", extra_kv={"bert.pooling_type": 1})[0]
    with Session(path, plan_cache=False) as s:
        got = s.embed(TOKENS)
    np.testing.assert_allclose(got[0], _unit(bert_reference["mean"]), rtol=1e-4, atol=1e-5)


def test_bert_input_longer_than_its_positions_is_refused(bert: Path) -> None:
    with Session(bert, plan_cache=False) as s:
        with pytest.raises(EmbeddingError, match=r"input 1 has 129 tokens, more than the 128"):
            s.embed([TOKENS, [1] * 129])
        with pytest.raises(EmbeddingError, match=r"token ids must be in \[0, 64\).*found 0\.\.64"):
            s.embed([0, 64])
        with pytest.raises(EmbeddingError, match="input 0 is empty"):
            s.embed([[], TOKENS])
        with pytest.raises(EmbeddingError, match="no input"):
            s.embed([])
        assert s.embed([TOKENS[:128]]).shape == (1, 32)  # the session still works


WORDS = ["hello", "world", "the", "cat", "sat", "on", "a", "mat", "dog"]


@pytest.fixture(scope="module")
def bert_text(bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT as a GGUF with mean pooling and a WordPiece vocabulary ([CLS] 2, [SEP] 3, words from 5)."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *("\u2581" + w for w in WORDS)]
    tokens += [f"x{i}" for i in range(len(tokens), 64)]
    kv = {"bert.pooling_type": 1, "tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": [3] * 5 + [1] * (64 - 5), "tokenizer.ggml.bos_token_id": 2,
          "tokenizer.ggml.seperator_token_id": 3, "tokenizer.ggml.unknown_token_id": 1,
          "tokenizer.ggml.padding_token_id": 0}
    return H.hf_to_gguf(bert, tmp_path_factory.mktemp("bert-text") / "bert-text.gguf", "bert", "f32", extra_kv=kv)[0]


def test_bert_text_is_embedded_with_cls_and_sep(bert_text: Path, bert: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = [2, 5, 6, 7, 8, 3]  # [CLS] hello world the cat [SEP]
    model = transformers.BertModel.from_pretrained(bert, attn_implementation="eager").eval()
    with torch.no_grad():
        mean = model(torch.tensor([ids]), token_type_ids=torch.zeros(1, len(ids), dtype=torch.long))
    with Session(bert_text, plan_cache=False) as s:
        assert s.tokenize("Hello world the cat") == ids
        got = s.embed(["Hello world the cat", "the cat sat on a mat"])
    np.testing.assert_allclose(got[0], _unit(mean.last_hidden_state[0].numpy().mean(axis=0)), rtol=1e-4, atol=1e-5)
    assert float(got[0] @ got[1]) < 0.999


# --- decoders --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[Session]:
    with Session(smollm2_path, max_context=256, plan_cache=False) as s:
        yield s


def test_smollm2_embedding_is_the_mean_final_hidden_state(smollm2: Session, smollm2_path: Path) -> None:
    """Against the reference evaluator on the rewritten graph (weights dequantized by gguf): the CPU kernels
    quantize activations to 8 bits, hence cosine > 0.999 rather than equality."""
    m = load_model(smollm2_path)
    g = hidden_state_output(m.graph)
    ids = smollm2.tokenize(TEXTS[0])
    hidden = evaluate(g, _functional_feeds(g, ids), _weights(m), outputs=["hidden_states"])["hidden_states"]
    want = _unit(np.asarray(hidden, np.float64).mean(axis=0))
    got = smollm2.embed(TEXTS[0])
    assert got.shape == (1, 576) and got.dtype == np.float32
    assert abs(float(np.linalg.norm(got[0])) - 1.0) < 1e-5
    assert float(got[0] @ want) > 0.999 and float(np.abs(got[0] - want).max()) < 0.02


def test_smollm2_embeddings_are_deterministic_and_distinct(smollm2: Session) -> None:
    a = smollm2.embed(TEXTS)
    b = smollm2.embed([TEXTS[1], TEXTS[0]])
    np.testing.assert_array_equal(a, b[::-1])  # bit for bit, whatever the batch holds
    np.testing.assert_array_equal(a[0], smollm2.embed(smollm2.tokenize(TEXTS[0]))[0])  # text or its ids
    assert float(a[0] @ a[1]) < 0.95


def test_chunks_do_not_change_a_bit(smollm2: Session, smollm2_path: Path) -> None:
    """A session whose prefill chunk is 3 tokens embeds in several passes through the KV state: the same bits."""
    with Session(smollm2_path, max_context=256, max_batch=3, plan_cache=False) as small:
        np.testing.assert_array_equal(small.embed(TEXTS), smollm2.embed(TEXTS))


def test_embed_leaves_the_conversation_cache_alone(smollm2: Session) -> None:
    first = smollm2.generate("Hello", max_new_tokens=4)
    held = smollm2.kv_length
    smollm2.embed(TEXTS)
    assert smollm2.kv_length == held
    again = smollm2.generate("Hello", max_new_tokens=4)
    assert again.tokens == first.tokens and again.stats.cached_tokens == len(first.prompt_tokens)


def test_decoder_input_longer_than_the_context_is_refused(smollm2: Session) -> None:
    with pytest.raises(EmbeddingError, match="257 tokens, more than the 256"):
        smollm2.embed([[1] * 257])


def test_close_frees_the_embedding_executable(smollm2_path: Path) -> None:
    s = Session(smollm2_path, max_context=64, plan_cache=False)
    s.embed("hi")
    embedder = s._embedder
    assert embedder is not None and embedder.exe is not None
    s.close()
    assert embedder.exe is None
    with pytest.raises(SessionError, match="closed"):
        s.embed("hi")


# --- the route -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[tuple[str, Any]]:
    """The base URL of a server on SmolLM2 and its ServerState (to look at its engine while requests run)."""
    pytest.importorskip("openai")
    from serve_support import serving

    from uaii.runtime.serve import ServerState

    state = ServerState(model=smollm2_path, session_options={"max_context": 256, "plan_cache": False})
    with serving(state) as base:
        yield base, state


@pytest.fixture(scope="module")
def url(server: tuple[str, Any]) -> str:
    return server[0]


def test_route_with_the_openai_client(url: str, smollm2: Session, smollm2_path: Path) -> None:
    """The client asks for base64 by default and decodes it: the vectors are the session's, bit for bit."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    r = client.embeddings.create(model=smollm2_path.stem, input=TEXTS)
    want = smollm2.embed(TEXTS)
    assert [d.index for d in r.data] == [0, 1] and r.model == smollm2_path.stem
    np.testing.assert_array_equal(np.array([d.embedding for d in r.data], np.float32), want)
    n = sum(len(smollm2.tokenize(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n
    one = client.embeddings.create(model=smollm2_path.stem, input=smollm2.tokenize(TEXTS[1]), encoding_format="float",
                                   dimensions=576)
    np.testing.assert_array_equal(np.array(one.data[0].embedding, np.float32), want[1])


@pytest.mark.parametrize("body, status, needle", [
    ({"input": "hi", "dimensions": 64}, 400, "'dimensions' is 64, but the model gives 576-dimensional"),
    ({"input": [[1] * 257]}, 400, "257 tokens, more than the 256"),
    ({"input": [1, 2, 49152]}, 400, r"token ids must be in [0, 49152)"),
    ({"input": []}, 400, "no input"),
    ({"input": ["a", ""]}, 400, "input 1 is empty"),
    ({"input": [1.5]}, 400, "'input"),
    ({"input": "hi", "encoding_format": "int8"}, 400, "'encoding_format'"),
    ({"input": "hi", "model": "nope"}, 404, "nope"),
])
def test_route_refusals(url: str, body: dict[str, Any], status: int, needle: str) -> None:
    import httpx

    r = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]["message"]


def test_route_runs_beside_a_chat_stream(server: tuple[str, Any], smollm2_path: Path, smollm2: Session) -> None:
    """Embeddings requested while a greedy chat streams (its request still active in the engine when they
    return): the stream is what it is alone, the vectors are the session's (the embedding runs between two decode
    steps of the engine; nothing is shared but the weights)."""
    import json

    import httpx

    url, state = server

    chat = {"model": smollm2_path.stem, "messages": [{"role": "user", "content": "Count to twenty."}],
            "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    alone = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()["choices"][0]["message"]
    want = smollm2.embed(TEXTS)
    pieces: list[str] = []
    vectors: list[np.ndarray] = []
    active: list[int] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**chat, "stream": True}, timeout=120) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            pieces.append(delta.get("content") or "")
            if len(pieces) in (2, 10, 20):  # mid-stream
                r = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"},
                               timeout=120)
                vectors.append(np.array([d["embedding"] for d in r.json()["data"]], np.float32))
                active.append(state.loaded.engine.stats()["requests_active"])
    assert "".join(pieces) == alone["content"]
    assert len(vectors) == 3 and active[0] == 1, active  # the first one at least ran while the chat generated
    for got in vectors:
        np.testing.assert_array_equal(got, want)


def test_route_serves_an_encoder(bert_text: Path) -> None:
    """A BERT model loads without an engine (it does not generate): /v1/embeddings serves it, chat and completions
    say it is an embedding model (400), /metrics and the loaded model's stats work without an engine."""
    import httpx
    from serve_support import serving

    from uaii.runtime.serve import ServerState

    with Session(bert_text, plan_cache=False) as s:
        want = s.embed(["hello world", "the cat"])
    state = ServerState(model=bert_text, session_options={"plan_cache": False})
    assert state.loaded is not None and state.loaded.engine is None and not state.loaded.busy()
    with serving(state) as base:
        r = httpx.post(f"{base}/v1/embeddings", json={"input": ["hello world", "the cat"], "encoding_format": "float"},
                       timeout=60)
        long = httpx.post(f"{base}/v1/embeddings", json={"input": [[5] * 129]}, timeout=60)
        chat = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                          timeout=60)
        text = httpx.post(f"{base}/v1/completions", json={"prompt": [5, 6]}, timeout=60)
        metrics = httpx.get(f"{base}/metrics", timeout=60)
    needle = f"model {bert_text.stem} is an embedding model; it does not generate"
    for refused in (chat, text):
        assert refused.status_code == 400 and needle in refused.json()["error"]["message"], refused.text
    assert metrics.status_code == 200 and f'uaii_model_loaded{{model="{bert_text.stem}"}} 1.0' in metrics.text
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array([d["embedding"] for d in r.json()["data"]], np.float32), want)
    assert r.json()["usage"]["prompt_tokens"] == 8
    assert long.status_code == 400 and "129 tokens, more than the 128" in long.json()["error"]["message"]
