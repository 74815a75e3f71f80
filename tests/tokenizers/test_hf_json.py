"""tokenizer.json directories against transformers' AutoTokenizer on the same local files.

Each test trains a small tokenizer with HF `tokenizers` (byte-level BPE, Llama-style BPE with byte fallback,
WordPiece, Unigram), saves tokenizer.json + tokenizer_config.json into a temporary directory, and compares
`uaii.tokenizers.load(dir)` with `transformers.AutoTokenizer.from_pretrained(dir)`: ids with and without special
tokens, with special-token parsing on and off, decoded text, and the chat template.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFCore
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from uaii.tokenizers import HFTokenizer, load

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # local directories only; never a hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
    "def main():\n    print('hello')\n    return 0\n", "for i in range(10):\n\tx += i * 2",
    "Tokenizers split text into pieces; pieces map to ids.", "Numbers: 0 1 2 3 42 1234 3.14159 2024-01-01",
    "Привет, как дела? Всё хорошо.", "你好，世界。我们在测试分词器。", "مرحبا بكم في الاختبار", "café naïve résumé",
    "I'm sure they're fine, we've checked and it's done.", "    indented\n        more\n\n\nblank lines",
    "emoji 😀 👍 🎉 and symbols © ® ™ → ←", "UPPER lower Mixed CamelCase snake_case kebab-case",
] * 20
TEXTS = [
    "Hello, world!", "The quick brown fox.", "  leading and trailing  ", "\n\n\ttabs\tand\nnewlines\n",
    "unseen wörds: Ωmega ζeta", "12345678901234567890", "😀👍🏽👨‍👩‍👧", "日本語のテキスト", "Привет мир",
    "<|im_start|>user\nhi<|im_end|>\n", "text<|endoftext|>more", "<|im_start|>", "", " ", "a", "[CLS] x [SEP]",
    "I'm here, aren't you? Yes .", "x = f(a, b) # comment",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye 👋"}]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _save(tmp: Path, core: HFCore, config: dict[str, Any]) -> Path:
    core.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp


def byte_level_bpe(tmp: Path) -> Path:
    core = HFCore(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.ByteLevel(trim_offsets=False)
    core.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _save(tmp, core, {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
                             "eos_token": "<|im_end|>", "chat_template": CHATML})


def llama_bpe(tmp: Path, *, add_bos: bool = True, add_eos: bool = False) -> Path:
    core = HFCore(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    core.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"]))
    data = json.loads(core.to_str())                 # byte-fallback pieces <0x00>..<0xFF> as ordinary vocabulary
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    core = HFCore.from_str(json.dumps(data))
    config = {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": add_bos, "add_eos_token": add_eos, "legacy": None}
    return _save(tmp, core, config)


def wordpiece(tmp: Path) -> Path:
    core = HFCore(models.WordPiece(unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    core.train_from_iterator(CORPUS, trainers.WordPieceTrainer(
        vocab_size=500, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    cls, sep = core.token_to_id("[CLS]"), core.token_to_id("[SEP]")
    core.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return _save(tmp, core, {"tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]",
                             "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]",
                             "clean_up_tokenization_spaces": True})


def unigram(tmp: Path) -> Path:
    core = HFCore(models.Unigram())
    core.normalizer = normalizers.NFKC()
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    core.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=400, unk_token="<unk>",
                                                             special_tokens=["<unk>", "<s>", "</s>", *SPECIALS]))
    core.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[
        ("</s>", core.token_to_id("</s>"))])
    return _save(tmp, core, {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>"})


BUILDERS = {"byte_level_bpe": byte_level_bpe, "llama_bpe": llama_bpe, "wordpiece": wordpiece, "unigram": unigram}


@pytest.fixture(params=sorted(BUILDERS))
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[HFTokenizer, Any]:
    directory = BUILDERS[request.param](tmp_path)
    ours = load(directory)
    assert isinstance(ours, HFTokenizer)
    return ours, transformers.AutoTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(pair: tuple[HFTokenizer, Any], text: str) -> None:
    ours, ref = pair
    assert ours.encode(text, parse_special=True) == ref(text)["input_ids"]
    assert ours.encode(text, add_special=False, parse_special=True) == ref(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == ref(text, split_special_tokens=True)["input_ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers(pair: tuple[HFTokenizer, Any], text: str) -> None:
    ours, ref = pair
    ids = ref(text)["input_ids"]
    assert ours.decode(ids, skip_special=False) == ref.decode(ids)
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True)


def test_vocab_queries_match(pair: tuple[HFTokenizer, Any]) -> None:
    ours, ref = pair
    assert ours.vocab_size == len(ref)
    for piece, i in list(ref.get_vocab().items())[:50]:
        assert ours.token_to_id(piece) == i and ours.id_to_piece(i) == piece
    assert ours.bos_id == ref.bos_token_id and ours.eos_id == ref.eos_token_id


@pytest.mark.parametrize(("add_bos", "add_eos"), [(True, False), (False, True), (True, True), (False, False)])
def test_llama_class_honours_add_bos_add_eos(tmp_path: Path, add_bos: bool, add_eos: bool) -> None:
    directory = llama_bpe(tmp_path, add_bos=add_bos, add_eos=add_eos)
    ours, ref = load(directory), transformers.AutoTokenizer.from_pretrained(str(directory))
    assert (ours.add_bos, ours.add_eos) == (add_bos, add_eos)
    for text in TEXTS:
        assert ours.encode(text, parse_special=True) == ref(text)["input_ids"]


def test_chat_template_matches_transformers(tmp_path: Path) -> None:
    directory = byte_level_bpe(tmp_path)
    ours, ref = load(directory), transformers.AutoTokenizer.from_pretrained(str(directory))
    for gen in (True, False):
        want = ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(MESSAGES, add_generation_prompt=gen) == want
    assert ours.chat_template_source == "tokenizer_config.json"
    want_ids = ref.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    assert ours.encode_chat(MESSAGES) == list(want_ids)


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    directory = byte_level_bpe(tmp_path)
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!", encoding="utf-8")
    ours = load(directory)
    assert ours.chat_template_source == "chat_template.jinja"
    assert ours.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_tokenizer_json_file_path_and_stop_ids(tmp_path: Path) -> None:
    directory = byte_level_bpe(tmp_path)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}), encoding="utf-8")
    tok = load(directory / "tokenizer.json")
    assert tok.kind == "tokenizer.json"
    assert {0, 2, tok.token_to_id("<|im_end|>")} <= tok.stop_ids
