"""Incremental detokenization for streaming: feed ids one at a time, get text that never splits a character.

The decoder keeps a short window of ids and decodes it with the tokenizer's own `decode`, so the streamed pieces
join to exactly `decode(ids)`. Text is held back while the window ends in U+FFFD (an incomplete UTF-8 sequence,
e.g. the byte-fallback tokens <0xE2><0x82> of '€' before <0xAC> arrives) and, for tokenizers that clean up spaces
before punctuation when decoding, while a space near the end may still be removed. `finish()` flushes the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uaii.tokenizers.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
_CLEANUP_LOOKAHEAD = 4          # the longest cleanup rule looks 4 characters past a space (" n't")
_WINDOW = 8                     # ids kept before the window is moved up to the newest id


class StreamDecoder:
    """Turns a stream of token ids into text pieces; `"".join(pieces) + finish() == tokenizer.decode(ids)`."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._ids: list[int] = []
        self._start = 0          # first id of the decode window
        self._sent = 0           # characters of decode(ids[start:]) already returned

    @property
    def ids(self) -> list[int]:
        """Every id fed so far."""
        return list(self._ids)

    def step(self, token_id: int) -> str:
        """Feed one id; return the text that is now final ('' while a character or a cleanup is pending)."""
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids[self._start:], skip_special=self._skip_special)
        safe = self._safe_end(text)
        piece = text[self._sent:safe] if safe > self._sent else ""
        self._sent = max(self._sent, safe)
        if safe == len(text) and len(self._ids) - self._start > _WINDOW:
            # Everything is out: restart the window at the newest id, which stays as context so that a decoder
            # that treats the first id specially (leading-space removal) treats the same id specially again.
            self._start = len(self._ids) - 1
            self._sent = len(self._tok.decode(self._ids[self._start:], skip_special=self._skip_special))
        return piece

    def feed(self, ids: Iterable[int]) -> str:
        """Feed several ids; return the text they completed."""
        return "".join(self.step(i) for i in ids)

    def finish(self) -> str:
        """End of stream: return whatever was held back (an incomplete character decodes to U+FFFD here)."""
        text = self._tok.decode(self._ids[self._start:], skip_special=self._skip_special)
        piece = text[self._sent:]
        self._start, self._sent = len(self._ids), 0
        return piece

    def _safe_end(self, text: str) -> int:
        end = len(text.rstrip(_REPLACEMENT))
        if self._tok.cleans_up_spaces:
            space = text.rfind(" ", max(0, end - _CLEANUP_LOOKAHEAD), end)
            if space >= 0:
                end = space
        return end
