"""Chat templates: both real models' templates, transformers' rendering as the reference, and the sandbox."""

from __future__ import annotations

import os

import pytest

from uaii.tokenizers import ChatTemplateError, Tokenizer, render_chat_template
from uaii.tokenizers.chat import CHATML_TEMPLATE, GEMMA_TEMPLATE

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi! 👋"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "  What is 2+2?  "}]

SMOLLM2_EXPECTED = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi! 👋<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n  What is 2+2?  <|im_end|>\n<|im_start|>assistant\n")
SMOLLM2_DEFAULT_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                          "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
# Gemma 3's published format, checked by hand: BOS, the system prompt folded into the first user turn, 'model' for
# the assistant role, content trimmed, <end_of_turn> and a newline after each turn.
GEMMA3_EXPECTED = (
    "<bos><start_of_turn>user\nYou are terse.\n\nHi! 👋<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")


def _transformers_render(template: str, messages: list[dict], add_generation_prompt: bool, **special: str) -> str:
    """transformers' own renderer (the function behind apply_chat_template), on the same template text."""
    transformers = pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                        add_generation_prompt=add_generation_prompt, **special)
    assert isinstance(transformers.__version__, str)
    return rendered[0]


def test_smollm2_template(smollm2_tok: Tokenizer) -> None:
    assert smollm2_tok.apply_chat_template(MESSAGES) == SMOLLM2_EXPECTED
    assert smollm2_tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=False) \
        == SMOLLM2_DEFAULT_SYSTEM


def test_smollm2_template_matches_transformers(smollm2_tok: Tokenizer) -> None:
    assert smollm2_tok.chat_template is not None
    for gen in (True, False):
        want = _transformers_render(smollm2_tok.chat_template, MESSAGES, gen, bos_token="<|im_start|>",
                                    eos_token="<|im_end|>")
        assert smollm2_tok.apply_chat_template(MESSAGES, add_generation_prompt=gen) == want


def test_gemma3_template(gemma3_tok: Tokenizer) -> None:
    assert gemma3_tok.apply_chat_template(MESSAGES) == GEMMA3_EXPECTED
    with pytest.raises(ChatTemplateError, match="alternate"):
        gemma3_tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_gemma3_template_matches_transformers(gemma3_tok: Tokenizer) -> None:
    want = _transformers_render(GEMMA_TEMPLATE, MESSAGES, True, bos_token="<bos>", eos_token="<eos>")
    assert gemma3_tok.apply_chat_template(MESSAGES) == want


def test_encode_chat_parses_specials_and_adds_bos_once(gemma3_tok: Tokenizer, smollm2_tok: Tokenizer) -> None:
    ids = gemma3_tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[:3] == [2, 105, gemma3_tok.encode("user", add_special=False)[0]] and ids.count(2) == 1
    ids = smollm2_tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == smollm2_tok.token_to_id("<|im_start|>") and smollm2_tok.eot_id in ids


def test_builtin_chatml_matches_transformers() -> None:
    want = _transformers_render(CHATML_TEMPLATE, MESSAGES, True)
    assert render_chat_template(CHATML_TEMPLATE, MESSAGES) == want


def test_helpers_like_transformers() -> None:
    template = ("{{ messages | tojson }}|{{ strftime_now('%Y') | length }}|{% for m in messages %}"
                "{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
                "{% generation %}gen{% endgeneration %}")
    out = render_chat_template(template, [{"role": "user", "content": "é"}, {"role": "x", "content": ""}])
    assert out == '[{"role": "user", "content": "é"}, {"role": "x", "content": ""}]|4|usergen'
    with pytest.raises(ChatTemplateError, match="custom failure"):
        render_chat_template("{{ raise_exception('custom failure') }}", [])


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['__builtins__'] }}",
    "{% set x = messages.append({'role': 'evil'}) %}{{ x }}",
    "{{ messages.pop() }}",
    "{{ messages[0].update({'role': 'evil'}) }}",
    "{{ strftime_now.__globals__ }}",
    "{{ range(10**9) | list | length }}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('id').read() }}",
])
def test_sandbox_blocks_escapes(template: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    try:
        out = render_chat_template(template, messages)
    except ChatTemplateError:
        return
    # A sandbox may also render an unsafe attribute as undefined (empty) instead of raising: never any content.
    assert out.strip() in ("", "()"), out
    assert messages == [{"role": "user", "content": "hi"}]


def test_syntax_error_and_missing_template(tmp_path) -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template("{% for %}", [])
    from uaii.tokenizers import load

    (tmp_path / "vocab.txt").write_text("<unk>\nhello\n", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        load(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
