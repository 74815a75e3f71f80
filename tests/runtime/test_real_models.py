"""Real models against transformers loading the same GGUF (dequantized to f32 by transformers).

With ``UAII_CPU_GEMM=f32`` (exact float dot products) our logits must match transformers' to 1e-3 and the top-1
token must agree on every prompt. The default fast GEMM quantizes activations to 8 bits for block-quantized weights,
as llama.cpp does; it must still agree on the top-1 token for at least 4 of the 5 prompts. Common-prefix lengths of
32-token greedy continuations are printed (run with -s to see them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.runtime import Session

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, there was a", "The three primary colors are"]
N_GEN = 32


def _reference(path: Path) -> dict[str, Any]:
    """transformers on the dequantized GGUF: last-token logits and greedy continuations, on our token ids."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    with Session(path) as s:
        prompts = [s.tokenize(p) for p in PROMPTS]
    out: dict[str, Any] = {"ids": prompts, "logits": [], "greedy": []}
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            out["logits"].append(model(x).logits[0, -1].numpy())
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N_GEN, min_new_tokens=N_GEN,
                                 do_sample=False)
            out["greedy"].append(gen[0, len(ids):].tolist())
    return out


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _compare(path: Path, ref: dict[str, Any]) -> tuple[int, list[int], float]:
    agree, prefixes, worst = 0, [], 0.0
    with Session(path) as s:
        for ids, logits, greedy in zip(ref["ids"], ref["logits"], ref["greedy"], strict=True):
            s.reset()
            ours = s.forward(ids)
            worst = max(worst, float(np.max(np.abs(ours - logits))))
            agree += int(np.argmax(ours)) == int(np.argmax(logits))
            gen = s.generate(ids, max_new_tokens=N_GEN, ignore_eos=True, add_special=False)
            prefixes.append(_prefix(gen.tokens, greedy))
    return agree, prefixes, worst


def _check(name: str, path: Path, ref: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UAII_CPU_GEMM", "f32")
    agree, prefixes, worst = _compare(path, ref)
    print(f"\n{name} exact f32 GEMM: top-1 {agree}/5, max |Δ logits| {worst:.2e}, common prefixes {prefixes}")
    assert agree == 5 and worst < 1e-3
    assert min(prefixes) >= 16, prefixes
    monkeypatch.setenv("UAII_CPU_GEMM", "fast")
    agree, prefixes, worst = _compare(path, ref)
    print(f"{name} fast GEMM (q8 activations): top-1 {agree}/5, max |Δ logits| {worst:.2f}, common prefixes "
          f"{prefixes}")
    assert agree >= 4 and worst < 2.0


def test_smollm2_generates_sensible_text(smollm2_path: Path) -> None:
    with Session(smollm2_path) as s:
        r = s.generate("The capital of France is", max_new_tokens=8)
        assert "Paris" in r.text, r.text
        reply = s.chat([{"role": "user", "content": "What is the capital of France? One word."}], max_new_tokens=16)
        assert "Paris" in reply.text and reply.finish_reason in ("eos", "length"), reply


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check("SmolLM2-135M Q4_1", smollm2_path, _reference(smollm2_path), monkeypatch)


@pytest.mark.slow
def test_gemma3_matches_transformers(gemma3_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check("Gemma-3-270M Q4_K_M", gemma3_path, _reference(gemma3_path), monkeypatch)


def test_gemma3_generates_sensible_text(gemma3_path: Path) -> None:
    with Session(gemma3_path) as s:
        r = s.generate("Water boils at a temperature of", max_new_tokens=8)
        assert "100" in r.text, r.text
