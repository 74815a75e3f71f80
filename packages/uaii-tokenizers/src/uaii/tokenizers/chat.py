"""Chat templates: render a model's Jinja2 template in a sandbox, the way HF transformers does.

The environment is `jinja2.sandbox.ImmutableSandboxedEnvironment` (no attribute escapes such as
`''.__class__.__mro__`, no mutation of the messages) with transformers' settings and helpers: `trim_blocks`,
`lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block that renders its body, `raise_exception`,
`strftime_now` and a `tojson` filter that keeps non-ASCII text. Templates are compiled once and cached.

Models without a template (the Gemma 3 GGUF ships none) get a built-in one when their vocabulary identifies the
family: Gemma's turn markers or ChatML's `<|im_start|>`; anything else is an error that says so.

Jinja2 is imported on the first render (`chat_jinja`), not with the tokenizer: it is ~6 MiB of RSS that a
process which only encodes and decodes never needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


def render(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
           **variables: Any) -> str:
    """Render `source` for `messages`; template errors and sandbox violations raise `ChatTemplateError`."""
    from uaii.tokenizers.chat_jinja import render_template

    return render_template(source, messages, add_generation_prompt=add_generation_prompt, **variables)
