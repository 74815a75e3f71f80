"""The one rule for text that enters a tokenizer: it must be valid Unicode that UTF-8 can carry.

Python hands us bytes that are not UTF-8 as *lone surrogates*: ``sys.argv`` and ``sys.stdin`` decode with
``surrogateescape`` (the byte 0xff becomes U+DCFF), and a str may hold any surrogate code point. No tokenizer can
encode one (UTF-8 has no surrogates), and guessing — dropping the byte, or replacing it with U+FFFD — would change
the prompt behind the user's back. So :meth:`Tokenizer.encode` refuses such text with a :class:`TokenizerError`
that says where the bad byte is, and callers that read text themselves (the CLI) use :func:`utf8_problem` to
say the same before any work starts.
"""

from __future__ import annotations

import re

from uaii.tokenizers.errors import TokenizerError

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED = range(0xDC80, 0xDD00)  # surrogateescape's encoding of the bytes 0x80-0xff


def utf8_problem(text: str) -> str | None:
    """Where ``text`` stops being valid UTF-8 (``byte 0xff at offset 3``), or None when it is valid.

    The offset counts bytes of the text as it came in: each escaped byte is one byte, every other character its
    UTF-8 length. A surrogate that no byte escape made is named as a code point with its character index.
    """
    if text.isascii():
        return None
    m = _SURROGATE.search(text)
    if m is None:
        return None
    offset = len(text[:m.start()].encode("utf-8"))  # no surrogate before the first one
    code = ord(m.group())
    if code in _ESCAPED:
        return f"byte {code - 0xDC00:#04x} at offset {offset}"
    return f"lone surrogate U+{code:04X} at character {m.start()} (byte offset {offset})"


def check_text(text: str, what: str = "the text") -> str:
    """``text`` itself when it is valid UTF-8; otherwise a TokenizerError that names ``what`` and the offset."""
    problem = utf8_problem(text)
    if problem is not None:
        raise TokenizerError(f"{what} is not valid UTF-8: {problem}; encode it as UTF-8 (invalid bytes are "
                             "refused, never replaced)")
    return text


__all__ = ["check_text", "utf8_problem"]
