"""The Jinja2 side of chat templates (see `chat`): the sandboxed environment, template compilation, rendering."""

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


def render_template(source: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
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
