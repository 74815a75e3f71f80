"""The `Tokenizer` interface every loader returns, and what all tokenizers share (chat, streaming, stop ids)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from uaii.tokenizers import chat
from uaii.tokenizers.errors import ChatTemplateError, TokenizerError
from uaii.tokenizers.fim import FimTokens, vocabulary_ids
from uaii.tokenizers.stream import StreamDecoder
from uaii.tokenizers.text import check_text

# Tokens that end a turn (llama.cpp's end-of-generation list, by text); a model's own eos/eot ids are added to it.
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|return|>", "<|call|>", "<｜end▁of▁sentence｜>",
})


class Tokenizer(ABC):
    """Text <-> token ids for one model, with its special tokens, chat template and a streaming decoder.

    Attributes:
        kind: what was loaded and how it tokenizes, e.g. ``gguf:gpt2(smollm)``, ``gguf:llama``, ``tokenizer.json``.
        path: the file or directory it came from.
        bos_id, eos_id, eot_id, pad_id, unk_id: special ids (``None`` when the model has none).
        add_bos, add_eos: whether `encode(..., add_special=True)` adds them, as the model's metadata says.
        stop_ids: ids that end generation (eos, eot and the end-of-turn tokens of the vocabulary).
        chat_template, chat_template_source: the Jinja2 template and where it came from (``gguf``,
            ``tokenizer_config.json``, ``chat_template.jinja``, ``builtin:gemma``, ``builtin:chatml``) or None.
    """

    kind: str
    path: str
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    pad_id: int | None = None
    unk_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None
    chat_template_source: str | None = None
    cleans_up_spaces: bool = False          # decode removes spaces before punctuation (the stream holds them back)
    _stop_ids: frozenset[int] = frozenset()
    _fim_meta: FimTokens | None = None      # the FIM ids the model file names (GGUF metadata), see fim_tokens()

    # ----------------------------------------------------------------------------------------- implemented per kind
    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""

    @abstractmethod
    def _encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of `text`, which :meth:`encode` has already checked: a str of valid UTF-8."""

    @abstractmethod
    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of `ids`; control tokens are left out unless `skip_special` is False."""

    @abstractmethod
    def token_to_id(self, piece: str) -> int | None:
        """The id of a vocabulary piece (exact text, e.g. ``Ġthe`` or ``▁the``), or None."""

    @abstractmethod
    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of an id; raises `TokenizerError` for an id out of range."""

    @abstractmethod
    def is_special(self, token_id: int) -> bool:
        """Whether an id is a control/special token (left out by `decode` by default)."""

    # ---------------------------------------------------------------------------------------------------- shared
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS/EOS (or the model's template) as its metadata says.
        parse_special: turn special-token text in `text` (``<|im_start|>``, ``<start_of_turn>``) into the special
            ids; when False it is tokenized as ordinary text (user-defined tokens are always matched, as in
            llama.cpp and HF tokenizers).

        The text is checked here, once for every kind — a plugin's too: a str, and valid UTF-8
        (:mod:`uaii.tokenizers.text`); a kind implements only :meth:`_encode`.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        return self._encode(check_text(text), add_special=add_special, parse_special=parse_special)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end generation: eos, eot and the vocabulary's end-of-turn tokens (<|im_end|>, <end_of_turn>)."""
        return self._stop_ids

    def _finish_specials(self) -> None:
        """Derive eot_id and stop_ids from the vocabulary once the ids are known (called by each loader)."""
        found = {t: i for t in EOG_TEXTS if (i := self.token_to_id(t)) is not None}
        if self.eot_id is None:
            for text in ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "<EOT>"):
                if text in found:
                    self.eot_id = found[text]
                    break
        self._stop_ids = frozenset(
            {i for i in (self.eos_id, self.eot_id) if i is not None} | set(found.values()))

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle ids (prefix, suffix, middle) of this vocabulary, or None when it has none: the ones
        the model file names, else a known family of FIM pieces (see :mod:`uaii.tokenizers.fim`)."""
        return self._fim_meta if self._fim_meta is not None else vocabulary_ids(self.token_to_id)

    def stream(self, *, skip_special: bool = True) -> StreamDecoder:
        """A decoder for generated ids: `step(id)` returns text as soon as it is complete UTF-8."""
        return StreamDecoder(self, skip_special=skip_special)

    def _template_variables(self) -> dict[str, Any]:
        def text(i: int | None) -> str:
            return "" if i is None else self.id_to_piece(i)
        return {"bos_token": text(self.bos_id), "eos_token": text(self.eos_id), "pad_token": text(self.pad_id),
                "unk_token": text(self.unk_id)}

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                            template: str | None = None, **variables: Any) -> str:
        """Render `messages` ([{'role': ..., 'content': ...}, ...]) with the model's chat template.

        `template` overrides the model's; extra keyword arguments (tools, documents, ...) reach the template.
        bos_token/eos_token are set from the vocabulary, as transformers does.
        """
        source = template or self.chat_template
        if source is None:
            raise ChatTemplateError(f"{self.path}: the model has no chat template and its vocabulary matches no "
                                    "built-in one (Gemma, ChatML); pass template=...")
        values = self._template_variables()
        values.update(variables)
        return chat.render(source, messages, add_generation_prompt=add_generation_prompt, **values)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    **variables: Any) -> list[int]:
        """Token ids of a rendered conversation: special tokens parsed; BOS added unless the template wrote it."""
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **variables)
        ids = self.encode(text, add_special=False, parse_special=True)
        if self.add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} vocab={self.vocab_size} path={self.path!r}>"
