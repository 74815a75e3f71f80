"""llama.cpp's byte-level BPE pre-tokenizers, by the GGUF key `tokenizer.ggml.pre`.

Each entry mirrors one `case LLAMA_VOCAB_PRE_TYPE_*` of llama.cpp's `llm_tokenizer_bpe` (src/llama-vocab.cpp): the
list of regexes applied one after another (every regex splits the pieces the previous one produced, keeping both
matches and the text between them), whether a word already in the vocabulary skips the merges (`ignore_merges`),
whether detokenizing cleans up spaces before punctuation (`clean_spaces`), and whether BOS is added when
the GGUF does not say (`add_bos`). HF `tokenizers` runs the regexes
(`pre_tokenizers.Split(..., "isolated")` in sequence) — the same split semantics as llama.cpp's
`unicode_regex_split`. The golden tests check the result against llama.cpp itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from uaii.tokenizers.errors import TokenizerError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_SEED_CODER = (_CONTRACTIONS
               + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+")
_BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
_UPPER_LOWER = r"((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
_UPPER_THEN = r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_LOWER + r"|[^\r\n\p{L}\p{N}]?" + _UPPER_THEN
           + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_LOWER + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?" + _UPPER_THEN
          + _CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: its regexes and the flags that go with it."""

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    clean_spaces: bool = True
    add_bos: bool = False          # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


def _entries() -> dict[str, PreTokenizer]:
    table: dict[str, PreTokenizer] = {}

    def add(names: str, regexes: tuple[str, ...], ignore_merges: bool = False, clean_spaces: bool = True,
            add_bos: bool = False) -> None:
        for name in names.split():
            table[name] = PreTokenizer(name, regexes, ignore_merges, clean_spaces, add_bos)

    add("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
    add("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", (_LLAMA3,),
        ignore_merges=True, add_bos=True)
    add("dbrx smaug-bpe chatglm-bpe", (_LLAMA3,))
    add("glm4 glm5", (_LLAMA3,), ignore_merges=True)
    add("falcon", (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"))
    add("gpt-2 gpt2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
        "jina-v2-code roberta-bpe exaone4 mpt olmo jais", (_GPT2,))
    add("trillion granite-docling", (_GPT2,), clean_spaces=False)
    add("starcoder refact codeshell exaone minerva-7b mellum2", (r"\p{N}", _GPT2))
    add("smollm command-r", (r"\p{N}", _GPT2), clean_spaces=False)
    add("stablelm2 megrez", (_QWEN2,))
    add("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", (_QWEN2,), clean_spaces=False)
    add("deepseek-coder", ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"), clean_spaces=False)
    add("viking", (_PORO, r"\p{N}"), clean_spaces=False)
    add("poro-chat", (_PORO,), clean_spaces=False)
    add("bloom gpt3-finnish", (_PORO,))
    add("tekken", (_TEKKEN,), ignore_merges=True, clean_spaces=False, add_bos=True)
    add("gpt-4o llama4 kanana2 talkie minimax-m2", (_GPT4O,), clean_spaces=False)
    add("seed-coder", (_SEED_CODER,), clean_spaces=False)
    add("bailingmoe bailingmoe2 llada-moe", (_BAILING,), clean_spaces=False)
    return table


PRE_TOKENIZERS: dict[str, PreTokenizer] = _entries()


def pre_tokenizer(name: str | None, *, path: str = "") -> PreTokenizer:
    """The pre-tokenizer for `tokenizer.ggml.pre` (missing or empty means 'default', as in llama.cpp)."""
    key = name or "default"
    try:
        return PRE_TOKENIZERS[key]
    except KeyError:
        where = f"{path}: " if path else ""
        raise TokenizerError(f"{where}unknown pre-tokenizer type tokenizer.ggml.pre = {key!r}; supported: "
                             + ", ".join(sorted(PRE_TOKENIZERS))) from None
