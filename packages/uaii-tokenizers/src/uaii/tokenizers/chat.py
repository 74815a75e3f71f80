"""Chat templates: render a model's Jinja2 template in a sandbox, the way HF transformers does.

The environment is `jinja2.sandbox.ImmutableSandboxedEnvironment` (no attribute escapes such as
`''.__class__.__mro__`, no mutation of the messages) with transformers' settings and helpers: `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block that renders its body, `raise_exception`,
`strftime_now` and a `tojson` filter that keeps non-ASCII text. Templates are compiled once and cached.

Models without a template (the Gemma 3 GGUF ships none) get a built-in one when their vocabulary identifies the
family: Gemma's turn markers or ChatML's `<|im_start|>`; anything else is an error that says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from uaii.tokenizers.errors import ChatTemplateError

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The chat template Google publishes with Gemma 3 (tokenizer_config.json of the instruction-tuned models).
GEMMA_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def builtin_template(vocab: Mapping[str, int] | Any) -> tuple[str, str] | None:
    """(name, template) of the built-in template for a vocabulary that identifies its chat family, else None."""
    if "<start_of_turn>" in vocab and "<end_of_turn>" in vocab:
        return "builtin:gemma", GEMMA_TEMPLATE
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return "builtin:chatml", CHATML_TEMPLATE
    return None


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by some templates to mark assistant text): renders the body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API declares tags as a class attribute

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template (cached by its text); a syntax error becomes a `ChatTemplateError`."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc.message} (line {exc.lineno})") from None


def render(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
           **variables: Any) -> str:
    """Render `source` for `messages`; template errors and sandbox violations raise `ChatTemplateError`."""
    template = compile_template(source)
    try:
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.SecurityError as exc:
        raise ChatTemplateError(f"chat template blocked by the sandbox: {exc}") from None
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from None
    except Exception as exc:  # a template is input: any failure of it is a template error
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
