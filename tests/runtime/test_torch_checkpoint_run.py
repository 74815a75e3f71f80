"""A PyTorch checkpoint directory (``save_pretrained(safe_serialization=False)``) runs like its safetensors twin:
the same greedy tokens through the CPU backend, mapped or streamed under a budget, and ``uaii run DIR``
generates from it (issue #15)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from logits_support import prompt_logits

from uaii.runtime import Session
from uaii.runtime.cli import main

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = [3, 17, 5, 9, 22, 40, 1, 8]


@pytest.fixture(scope="module")
def torch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny llama as the ``tiny`` fixture (same seed), saved as pytorch_model.bin."""
    import loader_helpers as H
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = H.save_tiny("llama", tmp_path_factory.mktemp("torch") / "llama", safe=False)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))  # words w0..w63 = ids
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    return d


def test_tokens_equal_the_safetensors_twin_mapped_and_streamed(tiny: Path, torch_dir: Path) -> None:
    assert (torch_dir / "pytorch_model.bin").is_file() and not list(torch_dir.glob("*.safetensors"))
    with Session(tiny, plan_cache=False) as s:
        want = list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens)
    with Session(torch_dir, plan_cache=False) as s:
        assert s.storage_stats()["mode"] == "mmap"
        assert list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens) == want
        assert s.model_info is not None
        weight_bytes = int(s.model_info.weight_bytes)
    # half the weights pinned or streamed, plus room for the arena and staging (the tiny model: ~90 KB of weights)
    with Session(torch_dir, plan_cache=False, budget_bytes=weight_bytes // 2 + 70_000, max_context=64,
                 max_batch=16) as s:
        assert s.streaming and s.storage_stats()["mode"] == "streaming"
        assert list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens) == want
        assert s.storage_stats()["bytes_read"] > 0


def test_uaii_run_generates_from_a_torch_directory(torch_dir: Path, capsys: Any) -> None:
    text = " ".join(f"w{i}" for i in PROMPT)
    with Session(torch_dir, plan_cache=False, kv_dtype="f16", kv_window=0) as s:
        want = list(s.generate(text, max_new_tokens=6).tokens)
    code = main(["run", str(torch_dir), "-p", text, "-n", "6", "--json", "--kv-window", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out)
    assert obj["tokens"] == want and 1 <= len(want) <= 6


TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7], np.int64)


def _halved(d: Path, dtype: Any) -> Path:
    """``d``'s pytorch_model.bin rewritten in ``dtype`` (torch.save's zip format, as transformers writes it)."""
    import torch

    sd = torch.load(d / "pytorch_model.bin", weights_only=True)
    torch.save({k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}, d / "pytorch_model.bin")
    return d


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gpt2", "mixtral"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_cpu_backend_computes_transformers_logits(tmp_path: Path, arch: str, dtype: str) -> None:
    """Every logit of a prompt through the CPU backend (Session.run), against transformers computing the same weights
    in float32 (bf16 / f16 widen exactly): within 1e-5 of the logits' scale, as the reference evaluator is held."""
    import loader_helpers as H
    import torch
    import transformers

    d = H.save_tiny(arch, tmp_path / arch, safe=False)
    if dtype != "f32":
        _halved(d, torch.bfloat16 if dtype == "bf16" else torch.float16)
    _, model_name, _ = H.TINY[arch]
    model = getattr(transformers, model_name).from_pretrained(d, torch_dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(torch.from_numpy(TOKENS)[None]).logits[0].numpy()
    with Session(d, plan_cache=False) as s:
        got = prompt_logits(s, TOKENS)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= 1e-5, f"{arch} {dtype}: max|uaii cpu - transformers| / max|transformers| = {err:.2e}"
