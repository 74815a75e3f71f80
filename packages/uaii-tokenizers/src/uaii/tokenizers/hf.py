"""Tokenizers from Hugging Face files: `tokenizer.json` (HF `tokenizers`) and SentencePiece `tokenizer.model`.

A `tokenizer.json` directory is encoded and decoded by HF `tokenizers` exactly as transformers' fast tokenizers do:
its normalizer, pre-tokenizer, model, added tokens and post-processor (BOS/EOS, BERT's [CLS]/[SEP]). The
`tokenizer_config.json` beside it supplies what transformers takes from there: the special tokens, the chat template
(or `chat_template.jinja`), `clean_up_tokenization_spaces`, and for the tokenizer classes that rebuild the
post-processor from `add_bos_token`/`add_eos_token` (Llama, Gemma, Cohere, GPT-NeoX) the same rebuild.

A bare SentencePiece model is encoded by sentencepiece, with control pieces split out of the text when asked and
BOS/EOS per `tokenizer_config.json` (default: BOS when the model defines one, as Llama's tokenizer does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.tokenizers.errors import TokenizerError, TokenizerFormatError
from uaii.tokenizers.pieces import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, PieceTokenizer
from uaii.tokenizers.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where used: a GGUF tokenizer needs neither (together ~5 MiB of RSS)
    import sentencepiece as spm

    from tokenizers import Tokenizer as HFCore

# tokenizer_class -> (add_bos_token, add_eos_token) defaults of the transformers classes that rebuild the template
_TEMPLATE_CLASSES = {
    "LlamaTokenizer": (True, False), "CodeLlamaTokenizer": (True, False), "GemmaTokenizer": (True, False),
    "CohereTokenizer": (True, False), "GPTNeoXTokenizer": (False, False),
}


def read_json(path: Path) -> Any:
    """A JSON file, or a `TokenizerFormatError` naming it (with the byte offset of a syntax error)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TokenizerFormatError("not UTF-8 text", path=str(path), offset=exc.start) from None
    except json.JSONDecodeError as exc:
        raise TokenizerFormatError(f"invalid JSON: {exc.msg} (line {exc.lineno})", path=str(path),
                                   offset=exc.pos) from None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_config(directory: Path) -> dict[str, Any]:
    """tokenizer_config.json merged over special_tokens_map.json (either may be missing)."""
    config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        f = directory / name
        if f.is_file():
            data = read_json(f)
            if not isinstance(data, dict):
                raise TokenizerFormatError("expected a JSON object", path=str(f))
            config.update(data)
    return config


def chat_template_of(directory: Path, config: dict[str, Any]) -> tuple[str | None, str | None]:
    """The chat template of an HF directory and where it came from, as transformers finds it."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), "chat_template.jinja"
    template = config.get("chat_template")
    if isinstance(template, list):   # [{"name": ..., "template": ...}]: the "default" one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template, "tokenizer_config.json") if isinstance(template, str) else (None, None)


def _stop_ids_of(directory: Path) -> set[int]:
    f = directory / "generation_config.json"
    if not f.is_file():
        return set()
    eos = read_json(f).get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    return {int(i) for i in ids if isinstance(i, int)}


def _clean_up(text: str) -> str:
    """transformers' `clean_up_tokenization`."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class HFTokenizer(Tokenizer):
    """A `tokenizer.json` tokenizer: HF `tokenizers` semantics, as transformers' `PreTrainedTokenizerFast`."""

    def __init__(self, core: HFCore, *, path: str, config: dict[str, Any], directory: Path) -> None:
        self.kind, self.path = "tokenizer.json", path
        self._core = core
        self._split_core: HFCore | None = None         # the same tokenizer with special-token parsing off
        self.cleans_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        ids = {name: self._id_of(_token_text(config.get(f"{name}_token"))) for name in ("bos", "eos", "pad", "unk")}
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = ids["bos"], ids["eos"], ids["pad"], ids["unk"]
        cls = str(config.get("tokenizer_class") or "").removesuffix("Fast")
        if cls in _TEMPLATE_CLASSES:
            self._rebuild_post_processor(config, *_TEMPLATE_CLASSES[cls])
        probe = self._core.encode("", add_special_tokens=True).ids
        self.add_bos = self.bos_id is not None and probe[:1] == [self.bos_id]
        self.add_eos = self.eos_id is not None and probe[-1:] == [self.eos_id]
        self.chat_template, self.chat_template_source = chat_template_of(directory, config)
        self._finish_specials()
        self._stop_ids = self._stop_ids | _stop_ids_of(directory)

    def _id_of(self, text: str | None) -> int | None:
        return None if text is None else self._core.token_to_id(text)

    def _rebuild_post_processor(self, config: dict[str, Any], bos_default: bool, eos_default: bool) -> None:
        add_bos = bool(config.get("add_bos_token", bos_default))
        add_eos = bool(config.get("add_eos_token", eos_default))
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        if (add_bos and (bos is None or self.bos_id is None)) or (add_eos and (eos is None or self.eos_id is None)):
            raise TokenizerError(f"{self.path}: add_bos_token/add_eos_token set but the token is not in the vocabulary")
        from tokenizers import processors

        single = (f"{bos}:0 " if add_bos else "") + "$A:0" + (f" {eos}:0" if add_eos else "")
        pair = single + (f" {bos}:1" if add_bos else "") + " $B:1" + (f" {eos}:1" if add_eos else "")
        specials = ([(bos, self.bos_id)] if add_bos else []) + ([(eos, self.eos_id)] if add_eos else [])
        self._core.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    @property
    def vocab_size(self) -> int:
        return int(self._core.get_vocab_size(with_added_tokens=True))

    def _encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        core = self._core if parse_special else self._splitting_core()
        return list(core.encode(text, add_special_tokens=add_special).ids)

    def _splitting_core(self) -> HFCore:
        if self._split_core is None:
            from tokenizers import Tokenizer as HFCore

            core = HFCore.from_str(self._core.to_str())
            core.encode_special_tokens = True            # transformers' split_special_tokens=True
            self._split_core = core
        return self._split_core

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        text = self._core.decode([int(i) for i in ids], skip_special_tokens=skip_special)
        return _clean_up(text) if self.cleans_up_spaces else text

    def token_to_id(self, piece: str) -> int | None:
        return self._core.token_to_id(piece)

    def id_to_piece(self, token_id: int) -> str:
        piece = self._core.id_to_token(int(token_id)) if token_id >= 0 else None
        if piece is None:
            raise TokenizerError(f"token id {token_id} is out of range (vocabulary of {self.vocab_size})")
        return piece

    def is_special(self, token_id: int) -> bool:
        added = self._core.get_added_tokens_decoder().get(int(token_id))
        return bool(added is not None and added.special)


def load_tokenizer_json(path: Path) -> HFTokenizer:
    """A tokenizer.json file (or a directory that holds one) and its tokenizer_config.json."""
    file = path / "tokenizer.json" if path.is_dir() else path
    directory = file.parent
    from tokenizers import Tokenizer as HFCore

    read_json(file)  # a clear error with the byte offset for broken JSON, before HF's own message
    try:
        core = HFCore.from_file(str(file))
    except Exception as exc:
        raise TokenizerFormatError(f"not a tokenizer.json HF tokenizers can load: {exc}", path=str(file)) from None
    return HFTokenizer(core, path=str(path), config=load_config(directory), directory=directory)


def load_sentencepiece(path: Path) -> PieceTokenizer:
    """A SentencePiece `.model` file (or a directory with tokenizer.model) and its tokenizer_config.json."""
    import sentencepiece as spm

    file = path / "tokenizer.model" if path.is_dir() else path
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(file))
    except (OSError, RuntimeError) as exc:
        raise TokenizerFormatError(f"not a SentencePiece model: {exc}", path=str(file)) from None
    n = sp.GetPieceSize()
    pieces = [sp.IdToPiece(i) for i in range(n)]
    types = np.array([_sp_type(sp, i) for i in range(n)], dtype=np.int32)
    dummy_prefix = sp.EncodeAsPieces("a")[:1] != ["a"]
    tok = PieceTokenizer(kind="sentencepiece", path=str(path), pieces=pieces, types=types,
                         encoder=lambda texts: sp.encode(texts),
                         strip_first_space="first_text" if dummy_prefix else "none")
    tok._sp = sp  # type: ignore[attr-defined]
    config = load_config(file.parent)
    ids = {}
    for name, own in (("bos", sp.bos_id()), ("eos", sp.eos_id()), ("pad", sp.pad_id()), ("unk", sp.unk_id())):
        text = _token_text(config.get(f"{name}_token"))
        ids[name] = tok.token_to_id(text) if text is not None else (own if own >= 0 else None)
    tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id = ids["bos"], ids["eos"], ids["pad"], ids["unk"]
    tok.add_bos = bool(config.get("add_bos_token", tok.bos_id is not None))
    tok.add_eos = bool(config.get("add_eos_token", False))
    tok.chat_template, tok.chat_template_source = chat_template_of(file.parent, config)
    tok._finish_specials()
    return tok


def _sp_type(sp: spm.SentencePieceProcessor, i: int) -> int:
    # User-defined pieces are matched by sentencepiece itself and decode like normal ones: NORMAL here.
    for test, kind in ((sp.IsUnknown, UNKNOWN), (sp.IsControl, CONTROL), (sp.IsByte, BYTE), (sp.IsUnused, UNUSED)):
        if test(i):
            return kind
    return NORMAL
