"""Generate the tokenizer golden files: a text corpus and the ids llama.cpp gives for it on the real GGUF models.

The reference is llama.cpp through llama-cpp-python, run in a throwaway virtual environment outside the
repository (it compiles llama.cpp); this script imports nothing from uaii:

    uv venv /tmp/llamacpp && uv pip install --python /tmp/llamacpp llama-cpp-python
    /tmp/llamacpp/bin/python scripts/gen_tokenizer_golden.py            # both models, into tests/golden/tokenizers
    uv pip install --python /tmp/llamacpp gguf==0.17.1 tokenizers sentencepiece     # for --tiny
    /tmp/llamacpp/bin/python scripts/gen_tokenizer_golden.py --tiny     # also tiny.json (tiny GGUF vocabularies)

For every string of the corpus and each model it records, from `llama_tokenize` with add_special=True (so BOS is
added only where `tokenizer.ggml.add_bos_token` says so):
  ids          parse_special=False (special-token text is ordinary text; user-defined tokens still match)
  ids_special  parse_special=True
  text         `llama_detokenize(ids, remove_special=False, unparse_special=False)`, UTF-8 decoded with replacement
  text_special `llama_detokenize(ids_special, remove_special=False, unparse_special=True)`

The corpus is built here, deterministically (hand-written strings plus seeded random Unicode), and stored in the
golden files so the tests need neither this script nor llama.cpp.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "tests" / "golden" / "tokenizers"
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-Q4_K_M.gguf"}

ENGLISH = [
    "Hello world", "Hello, world!", "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll like it; we've tried, they're happy and he'd agree.", "DON'T SHOUT! It's FINE.",
    "a", "A", "I", " ", "  ", "Mr. Smith's car isn't here.", "e.g., i.e., etc. — and so on…",
    "What's the time? It's 5 o'clock.", "She said: \"yes\" (twice).", "naïve café résumé coöperate",
    "Well-known state-of-the-art systems.", "hello\nworld", "CamelCaseIdentifiersLikeThis", "snake_case_name",
    "UPPER lower MiXeD", "Once upon a time, in a land far, far away, there lived a tokenizer.",
    "The year 1984 was followed by 1985.", "It costs $19.99 (or €17,50).", "50% off!!! Only today???",
    "email@example.com", "https://example.org/path?q=1&r=two#frag", "C:\\Users\\name\\file.txt",
    "@mention #hashtag", "1st 2nd 3rd 4th", "ellipsis...", "quotes 'single' \"double\" `back`",
    "Ünïcödé diacritics: ñ, ç, ø, å, ß", "The end.",
]

CODE = [
    "def foo(x):\n    return x + 1\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "import numpy as np\nprint(np.arange(10))", "if __name__ == \"__main__\":\n    main()",
    "const f = (a, b) => a ?? b;", "SELECT * FROM users WHERE id = 42;", "<div class=\"x\">text</div>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}", "#include <stdio.h>\nint main(void) { return 0; }",
    "x = [i**2 for i in range(10) if i % 2 == 0]", "fn main() { println!(\"hi\"); }",
    "    indented four\n        indented eight", "a=b+c*d/e-f", "git commit -m 'fix: bug'",
    "```python\nprint('hi')\n```", "// comment\n/* block */", "<table><tr><td>1</td></tr></table>",
    "<h1>Title</h1><strong>bold</strong><em>em</em>", "$ ls -la | grep '^d' > out.txt",
    "λx. x + 1", "0x1F 0b1010 0o17 1e-9 3.14159", "<0x41> <0xE2> literal byte names",
]

WHITESPACE = [
    "\n", "\n\n", "\n\n\n", "\n\n\n\n\n\n\n\n", "\t", "\t\t", "\t\t\t\t", " \t \t ", "trailing spaces   ",
    "   leading spaces", "   both   ", "a  b   c    d     e", "line1\r\nline2\r\n", "\r", "mixed \n\t \n ",
    "word\n\n\nword", "tab\tseparated\tvalues", " \n \n ", "end with newline\n", "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space", "zero\u200bwidth", "\u2028line sep\u2029para sep", "x" + " " * 40 + "y",
    "\n" * 40, "\t" * 35, " " * 33,
]

CONTROL = ["a\x06b\x7f\x00c", "\x1b[31mred\x1b[0m", "\ufeffbyte order mark", "next\x85line", "bell\x07",
           "\x01\x02\x03\x04\x05", "\ufffd replacement char", "\U0010ffff\U000e0001 plane 16/14"]

DIGITS = [
    "0", "7", "42", "123", "1234", "12345", "123456789", "3141592653589793238462643383279502884197",
    "1,000,000", "1.000.000,00", "-273.15", "+49 30 1234567", "2024-01-31T23:59:59Z", "v1.2.3-rc.4",
    "00000000", "9" * 64, "١٢٣٤٥٦٧٨٩٠", "一二三 123 ４５６", "½ ¾ ² ³ Ⅻ", "10^6 = 1000000",
]

EMOJI = [
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷🇯🇵", "I ❤️ 🍕 and 🍣!", "🤖🤖🤖", "👩🏾‍💻 codes",
    "🧑‍🚀 in 🚀", "emoji at end 🎉", "🎉 emoji at start", "☕️ ⌚ ⚡", "keycap 1️⃣ #️⃣", "🫠🫡🪿",
]

SCRIPTS = [
    "你好，世界！", "我爱自然语言处理。", "東京は日本の首都です。", "ひらがな カタカナ 漢字", "안녕하세요 세계",
    "مرحبا بالعالم", "اللغة العربية جميلة جداً.", "שלום עולם", "Привет, мир!",
    "Съешь же ещё этих мягких французских булок.",
    "Ελληνικά γράμματα", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Tiếng Việt có dấu", "Türkçe: ığüşöç İI",
    "ქართული ენა", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ runes", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "∀x∈ℝ: x²≥0 ⇒ √x²=|x|",
    "Mixed English 中文 العربية русский", "e\u0301 combining acute", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "ﬁ ﬂ ligatures", "ｆｕｌｌｗｉｄｔｈ", "Ⅷ ⅷ ① ②", "🀄 mahjong", "\u200d\u200c joiners alone",
    "日本語の文章と English words が混在している。", "中文标点：“引号”、《书名》……",
]

SMOLLM_SPECIALS = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>", "text<|endoftext|>more text", "<|im_end|>",
    "<|im_start|><|im_end|><|im_start|>", "<|im_start", "im_start|>", "<|im_start|> spaced <|im_end|> out",
    "<repo_name>uaii<file_sep>main.py", "a<|endoftext|>", "<|endoftext|>", "<jupyter_code>print(1)",
]

GEMMA_SPECIALS = [
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>", "<start_of_turn>",
    "<end_of_turn>", "<start_of_turn><end_of_turn>", "<start_of_turn model", "<pad><unk><mask>",
    "<start_of_image> an image <end_of_image>", "[multimodal]", "<unused5> and <unused6241>",
    "word<end_of_turn>word", "  <start_of_turn>  ", "<b>bold</b> <i>it</i>",
]

RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
          (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x2000, 0x206F),
          (0x10000, 0x1007F), (0xE000, 0xE0FF), (0x1D400, 0x1D7FF)]


def random_strings(count: int, seed: int = 20240601) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.15:
                parts.append(rng.choice([" ", "  ", "\n", "\t", " \n", "\n\n"]))
            elif r < 0.25:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
            else:
                lo, hi = rng.choice(RANGES)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def corpus() -> list[dict[str, str]]:
    groups = {"english": ENGLISH, "code": CODE, "whitespace": WHITESPACE, "control": CONTROL, "digits": DIGITS,
              "emoji": EMOJI,
              "scripts": SCRIPTS, "special-chatml": SMOLLM_SPECIALS, "special-gemma": GEMMA_SPECIALS,
              "random": random_strings(70), "long": [" ".join(ENGLISH + CODE + SCRIPTS)]}
    cases, seen = [], set()
    for group, texts in groups.items():
        for text in texts:
            if text not in seen:
                seen.add(text)
                cases.append({"group": group, "text": text})
    return cases


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def detokenize(llama_cpp, vocab, ids: list[int], unparse_special: bool) -> str:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, unparse_special)
    if n < 0:
        raise RuntimeError(f"detokenize buffer too small ({-n} > {size})")
    return buf.raw[:n].decode("utf-8", errors="replace")


def generate(key: str, model_dir: Path, out_dir: Path) -> Path:
    import llama_cpp

    path = model_dir / MODELS[key]
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    cases = []
    for case in corpus():
        raw = case["text"].encode("utf-8")
        ids = llm.tokenize(raw, add_bos=True, special=False)
        ids_special = llm.tokenize(raw, add_bos=True, special=True)
        cases.append({**case, "ids": ids, "ids_special": ids_special,
                      "text_out": detokenize(llama_cpp, vocab, ids, False),
                      "text_special_out": detokenize(llama_cpp, vocab, ids_special, True)})
    doc = {
        "model": MODELS[key], "model_sha256": sha256_of(path),
        "reference": {"tool": "llama-cpp-python", "version": llama_cpp.__version__,
                      "call": "Llama(vocab_only=True).tokenize(text.encode(), add_bos=True, special=...); "
                              "llama_detokenize(ids, remove_special=False, unparse_special=...)"},
        "generator": "scripts/gen_tokenizer_golden.py",
        "count": len(cases), "cases": cases,
    }
    out = out_dir / f"{key}.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"}, ensure_ascii=False, indent=1)[:-2]
    out.write_text(head + ',\n "cases": [\n' + lines + "\n ]\n}\n", encoding="utf-8")
    json.loads(out.read_text(encoding="utf-8"))   # the file must parse
    return out


# ------------------------------------------------------------------------------------------ tiny vocabularies
TINY_PRE = ["default", "llama-bpe", "qwen2", "gpt-2", "starcoder", "smollm", "falcon", "deepseek-coder", "tekken",
            "gpt-4o", "chatglm-bpe", "poro-chat", "viking", "seed-coder", "bailingmoe", "stablelm2"]
BERT_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "hello", "world", "it",
              "is", "un", "##seen", "##s", "!", ",", ".", "?", "'", "a", "b", "##b", "你", "好", "caf", "##e", "na",
              "##ive", "1", "2", "##3", "de", "##f", "(", ")", ":", "x", "return"]


def tiny_texts() -> list[str]:
    return (ENGLISH[:14] + CODE[:10] + WHITESPACE[:16] + CONTROL[:3] + DIGITS[:12] + EMOJI[:5] + SCRIPTS[:10]
            + SMOLLM_SPECIALS[:3] + random_strings(8, seed=7))


def tiny_specs() -> dict[str, dict]:
    """Vocabularies trained here (HF tokenizers BPE, sentencepiece BPE) and a WordPiece list, as GGUF specs."""
    import io

    import sentencepiece as spm
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [c["text"] for c in corpus() if c["group"] != "random"] * 3
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(core.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    bpe = {"model": "gpt2", "tokens": tokens, "merges": merges, "token_type": [3, 3, 3, 3] + [1] * (len(tokens) - 4),
           "bos_id": 0, "eos_id": 1}
    specs = {f"bpe-{pre}": {**bpe, "pre": pre} for pre in TINY_PRE}
    specs["bpe-llama-bpe-bos"] = {**bpe, "pre": "llama-bpe", "add_bos": True, "add_eos": True}

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=buf, vocab_size=600, model_type="bpe",
                                   byte_fallback=True, character_coverage=0.98, minloglevel=2,
                                   user_defined_symbols=["<table>", "\n\n"])
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.GetPieceSize()

    def sp_type(i: int) -> int:
        for test, kind in ((sp.IsUnknown, 2), (sp.IsControl, 3), (sp.IsByte, 6), (sp.IsUnused, 5)):
            if test(i):
                return kind
        return 4 if sp.IdToPiece(i) in ("<table>", "\n\n") else 1

    spm_spec = {"model": "llama", "pre": "default", "tokens": [sp.IdToPiece(i) for i in range(n)],
                "scores": [sp.GetScore(i) for i in range(n)], "token_type": [sp_type(i) for i in range(n)],
                "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "unk_id": sp.unk_id()}
    specs["spm-space-prefix"] = {**spm_spec, "add_space_prefix": True}
    specs["spm-no-space-prefix"] = {**spm_spec, "add_space_prefix": False, "add_bos": False}

    bert_tokens = [w if w.startswith("[") else (w[2:] if w.startswith("##") else "\u2581" + w) for w in BERT_WORDS]
    specs["bert"] = {"arch": "bert", "model": "bert", "tokens": bert_tokens,
                     "token_type": [3 if w.startswith("[") else 1 for w in BERT_WORDS],
                     "bos_id": 2, "eos_id": 3, "sep_id": 3, "unk_id": 1, "pad_id": 0}
    return specs


def generate_tiny(out_dir: Path) -> Path:
    import importlib.util
    import tempfile

    import llama_cpp

    helper = importlib.util.spec_from_file_location("tiny_gguf", REPO / "tests" / "tokenizers" / "tiny_gguf.py")
    assert helper is not None and helper.loader is not None
    tiny = importlib.util.module_from_spec(helper)
    helper.loader.exec_module(tiny)
    texts = tiny_texts()
    configs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in tiny_specs().items():
            path = tiny.write_tiny_gguf(Path(tmp) / f"{name}.gguf", spec)
            llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
            vocab = llama_cpp.llama_model_get_vocab(llm.model)
            results = []
            for text in texts:
                raw = text.encode("utf-8")
                ids = llm.tokenize(raw, add_bos=True, special=False)
                ids_special = llm.tokenize(raw, add_bos=True, special=True)
                results.append([ids, ids_special, detokenize(llama_cpp, vocab, ids, False)])
            configs[name] = {"spec": spec, "results": results}
            del llm
    doc = {"reference": {"tool": "llama-cpp-python", "version": llama_cpp.__version__},
           "generator": "scripts/gen_tokenizer_golden.py --tiny",
           "results": "per config, per text: [ids, ids with parse_special, llama_detokenize(ids)]",
           "texts": texts, "configs": configs}
    out = out_dir / "tiny.json"
    out.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="smollm2, gemma3 (default: both)")
    default_dir = Path(os.environ.get("UAII_CACHE_DIR") or Path.home() / ".cache" / "uaii") / "models"
    ap.add_argument("--model-dir", type=Path, default=default_dir)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--tiny", action="store_true",
                    help="also write tiny.json: tiny GGUF vocabularies (16 BPE pre-tokenizer types, SentencePiece with "
                         "and without add_space_prefix, BERT WordPiece) and llama.cpp's ids for them")
    args = ap.parse_args(argv)
    if args.tiny:
        print(generate_tiny(args.out))
    for key in args.models or sorted(MODELS):
        if key not in MODELS:
            ap.error(f"unknown model {key!r}; choose from {', '.join(sorted(MODELS))}")
        print(generate(key, args.model_dir, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
