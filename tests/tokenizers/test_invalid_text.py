"""Text that is not valid UTF-8 (lone surrogates: argv/stdin bytes decoded with surrogateescape) is refused by every
tokenizer kind with a TokenizerError naming the byte and its offset — never a UnicodeEncodeError from inside."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
import tiny_gguf  # tests/tokenizers, on the test path
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFCore
from tokenizers import decoders, models, pre_tokenizers, trainers

from uaii.tokenizers import Tokenizer, TokenizerError, load
from uaii.tokenizers.text import check_text, utf8_problem

HERE = Path(__file__).resolve().parent
CONFIGS = json.loads((HERE.parent / "golden" / "tokenizers" / "tiny.json").read_text(encoding="utf-8"))["configs"]
KINDS = {"gpt2": "bpe-llama-bpe", "spm": "spm-space-prefix", "bert": "bert"}  # one GGUF vocabulary per encoder


def _tokenizer_json(tmp: Path) -> Path:
    core = HFCore(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(["café au lait", "hello world"] * 4, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    core.save(str(tmp / "tokenizer.json"))
    return tmp


@pytest.fixture(params=[*sorted(KINDS), "tokenizer.json"])
def tok(request: pytest.FixtureRequest, tmp_path: Path) -> Tokenizer:
    if request.param == "tokenizer.json":
        return load(_tokenizer_json(tmp_path))
    return load(tiny_gguf.write_tiny_gguf(tmp_path / "t.gguf", CONFIGS[KINDS[request.param]]["spec"]))


@pytest.mark.parametrize(("text", "where"), [
    ("caf\udcff", "byte 0xff at offset 3"),                     # `-p $'caf\xff'`: argv's surrogateescape
    ("caf\udcc3", "byte 0xc3 at offset 3"),                     # a UTF-8 sequence cut short
    ("café\udc80 au lait", "byte 0x80 at offset 5"),            # é is two bytes: offsets count bytes
    ("ab\ud800cd", "lone surrogate U+D800 at character 2 (byte offset 2)"),  # not from a byte escape
])
def test_every_tokenizer_refuses_invalid_utf8_naming_the_offset(tok: Tokenizer, text: str, where: str) -> None:
    for parse_special in (False, True):
        with pytest.raises(TokenizerError, match="^" + re.escape(f"[tokenizer] the text is not valid UTF-8: {where};")):
            tok.encode(text, parse_special=parse_special)
    assert tok.encode("café au lait")  # valid text still encodes


class _PluginTokenizer(Tokenizer):
    """A plugin's tokenizer: one id per character, written without any check of its own."""

    kind, path = "plugin:chars", "<test>"

    def __init__(self) -> None:
        self.seen: list[str] = []

    @property
    def vocab_size(self) -> int:
        return 0x110000

    def _encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.seen.append(text)
        return [ord(c) for c in text]

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return "".join(map(chr, ids))

    def token_to_id(self, piece: str) -> int | None:
        return ord(piece) if len(piece) == 1 else None

    def id_to_piece(self, token_id: int) -> str:
        return chr(token_id)

    def is_special(self, token_id: int) -> bool:
        return False


def test_a_plugin_tokenizer_gets_the_checks_without_writing_them() -> None:
    """Tokenizer.encode checks the text before the kind's _encode sees it: a plugin cannot forget the check."""
    tok = _PluginTokenizer()
    with pytest.raises(TokenizerError, match=r"^\[tokenizer\] the text is not valid UTF-8: byte 0xff at offset 3;"):
        tok.encode("caf\udcff")
    with pytest.raises(TokenizerError, match=r"encode\(\) takes a str, got bytes"):
        tok.encode(b"cafe")  # type: ignore[arg-type]
    assert tok.seen == [] and tok.encode("café") == [99, 97, 102, 233] and tok.seen == ["café"]


def test_a_chat_message_with_invalid_utf8_is_refused(tmp_path: Path) -> None:
    tok = load(tiny_gguf.write_tiny_gguf(tmp_path / "t.gguf", CONFIGS["bpe-llama-bpe"]["spec"]))
    tpl = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    with pytest.raises(TokenizerError, match=r"not valid UTF-8: byte 0xff at offset 2"):
        tok.encode_chat([{"role": "user", "content": "hi\udcff"}], template=tpl)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40))
def test_utf8_problem_finds_the_first_invalid_byte_of_any_input(data: bytes) -> None:
    """Oracle: Python's strict UTF-8 decoder. Text decoded with surrogateescape (as argv and stdin are) is refused
    exactly when the bytes are not UTF-8, and the offset is where the strict decoder stops."""
    text = data.decode("utf-8", "surrogateescape")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        assert utf8_problem(text) == f"byte {data[exc.start]:#04x} at offset {exc.start}"
        with pytest.raises(TokenizerError, match=f"the prompt is not valid UTF-8: byte {data[exc.start]:#04x}"):
            check_text(text, "the prompt")
    else:
        assert utf8_problem(text) is None and check_text(text) is text


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.integers(0xD800, 0xDFFF))
def test_any_surrogate_anywhere_is_found(before: str, after: str, code: int) -> None:
    problem = utf8_problem(before + chr(code) + after)
    assert problem is not None
    offset = len(before.encode("utf-8"))
    assert problem.endswith(f"at offset {offset}") or problem.endswith(f"(byte offset {offset})")
