"""A tiny llama GGUF that talks: random weights (loader_helpers' tiny llama, 128 positions) plus a character-level
SentencePiece vocabulary and a chat template, so that text prompts, streaming and `uaii run/chat` run for real.

Shared by the runtime tests that need text (tests/ is on the test path: `import chat_gguf`).
"""

from __future__ import annotations

import string
from pathlib import Path

import loader_helpers as H

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def tokenizer_kv(vocab_size: int = 64) -> dict[str, object]:
    """GGUF keys of a SentencePiece ("llama") tokenizer: <unk>, <s>, </s>, the space mark, one token per letter,
    digit and a few signs, then filler tokens up to ``vocab_size``."""
    tokens = ["<unk>", "<s>", "</s>", "\u2581", *string.ascii_lowercase, *"<>/.,!?0123456789"]
    tokens += [f"<t{i}>" for i in range(len(tokens), vocab_size)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [-float(i) for i in range(vocab_size)],
            "tokenizer.ggml.token_type": [2, 3, 3] + [1] * (vocab_size - 3),
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.chat_template": TEMPLATE}


def chat_llama(out_dir: Path) -> Path:
    """``out_dir``/tiny-chat-llama.gguf: the tiny llama (RoPE, 128 positions) that talks (its transformers
    directory is ``out_dir``/hf-llama)."""
    hf = H.save_tiny("llama", out_dir / "hf-llama")
    path = out_dir / "tiny-chat-llama.gguf"
    H.hf_to_gguf(hf, path, "llama", extra_kv=tokenizer_kv())
    return path
