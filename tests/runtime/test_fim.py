"""Fill-in-the-middle through ``/v1/completions`` with ``suffix``: a model with FIM ids (the tiny talking llama as a
GGUF naming them in its metadata, or carrying StarCoder's FIM pieces) gets the PSM prompt ``[BOS] <PRE> prompt
<SUF> suffix <MID>`` and generates what a Session generates from exactly those ids; SmolLM2, which has no FIM
tokens, gets a 400 that says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import chat_gguf
import loader_helpers as H
import pytest

from uaii.runtime import Session
from uaii.runtime.serve.errors import ApiError
from uaii.runtime.serve.openai_api import fim_prompt

openai = pytest.importorskip("openai")

from serve_support import running_server  # noqa: E402

OPTIONS = {"max_context": 128, "plan_cache": False}
PRE, SUF, MID = 60, 61, 62  # filler ids of chat_gguf's vocabulary


def _fim_gguf(talking: Path, out: Path, how: str) -> Path:
    """The talking llama with FIM ids: named by the GGUF metadata (``meta``) or as StarCoder pieces (``pieces``)."""
    kv = chat_gguf.tokenizer_kv()
    if how == "meta":
        kv |= {"tokenizer.ggml.fim_pre_token_id": PRE, "tokenizer.ggml.fim_suf_token_id": SUF,
               "tokenizer.ggml.fim_mid_token_id": MID}
    else:
        tokens = list(kv["tokenizer.ggml.tokens"])  # type: ignore[call-overload]
        tokens[PRE], tokens[SUF], tokens[MID] = "<fim_prefix>", "<fim_suffix>", "<fim_middle>"
        kv["tokenizer.ggml.tokens"] = tokens
    return H.hf_to_gguf(talking.parent / "hf-llama", out, "llama", extra_kv=kv)[0]


@pytest.fixture(scope="module", params=["meta", "pieces"])
def fim_model(request: pytest.FixtureRequest, talking: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fim_gguf(talking, tmp_path_factory.mktemp("fim") / f"fim-{request.param}.gguf", request.param)


def test_fim_prompt_is_psm_with_the_models_ids(fim_model: Path) -> None:
    with Session(fim_model, **OPTIONS) as s:
        tok = s.tokenizer
        ids = fim_prompt(s, "def f", "return x")
        pre, suf = tok.encode("def f", add_special=False), tok.encode("return x", add_special=False)
        assert ids == [tok.bos_id, PRE, *pre, SUF, *suf, MID]  # the talking vocabulary adds BOS


def test_completions_with_suffix_generate_from_the_fim_prompt(fim_model: Path) -> None:
    with Session(fim_model, **OPTIONS) as s:
        want = s.generate(fim_prompt(s, "ab", "cd"), max_new_tokens=6, ignore_eos=True)
    with running_server(model=fim_model, session_options=OPTIONS) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        got = client.completions.create(model=fim_model.stem, prompt="ab", suffix="cd", max_tokens=6,
                                        temperature=0, extra_body={"ignore_eos": True})
    assert got.usage is not None and got.usage.prompt_tokens == len(want.prompt_tokens)
    assert got.choices[0].text == want.text and got.usage.completion_tokens == len(want.tokens) == 6


@pytest.fixture(scope="module")
def smollm2_url(smollm2_path: Path) -> Iterator[str]:
    with running_server(model=smollm2_path, session_options={"max_context": 256}) as url:
        yield url


def test_smollm2_has_no_fim_so_suffix_is_a_400(smollm2_url: str, smollm2_path: Path) -> None:
    client = openai.OpenAI(base_url=f"{smollm2_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=smollm2_path.stem, prompt="def f(", suffix="    return x", max_tokens=4)
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "fim_unsupported" and error["param"] == "suffix"
    assert "has no fill-in-the-middle tokens (fim_pre/fim_suf/fim_mid" in error["message"]
    assert smollm2_path.name in error["message"]
    # the server goes on: the same prompt without a suffix is served
    assert client.completions.create(model=smollm2_path.stem, prompt="def f(", max_tokens=2).choices[0].text


def test_fim_prompt_without_fim_tokens_raises(talking: Path) -> None:
    with Session(talking, **OPTIONS) as s, pytest.raises(ApiError, match=r"tiny-chat-llama\.gguf has no fill-in"):
        fim_prompt(s, "a", "b")
