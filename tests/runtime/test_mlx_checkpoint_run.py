"""An MLX directory (what ``mlx_lm.convert`` writes, tests/loaders/mlx_fixtures.py) runs like any other model: every
case of the fixture matrix computes MLX's logits through the CPU backend (its packed kernels: uk_mlx_gemm,
uk_mlx_dequantize), a float conversion gives the greedy tokens of the safetensors directory it came from, a quantized
one the same tokens mapped and streamed under a budget, and ``uaii run DIR`` generates from it (issue #15)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx_fixtures as F
import numpy as np
import pytest
from logits_support import prompt_logits
from mlx_fixtures import HALF, TOL

from uaii.runtime import Session
from uaii.runtime.cli import main

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("mlx_lm")

PROMPT = [3, 17, 5, 9, 22, 40, 1, 8]
TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7], np.int64)


@pytest.fixture(scope="module")
def mlx_case(tmp_path_factory: pytest.TempPathFactory) -> F.Converted:
    return F.Converted(tmp_path_factory.mktemp("mlx-cases"))


@pytest.mark.parametrize("name", F.params(F.CASES))
def test_cpu_backend_computes_mlx_logits(mlx_case: F.Converted, name: str) -> None:
    """All logits of a prompt (Session.run: the functional graph, every row) against MLX's, with the bounds of the
    reference-evaluator test (tests/loaders/test_mlx_checkpoints.py)."""
    d = mlx_case(name)
    with Session(d, plan_cache=False) as s:
        got = prompt_logits(s, TOKENS)
    err = F.rel_err(got, F.mlx_logits(d, TOKENS))
    bound = HALF[name][1] if name in HALF else TOL
    assert err <= bound, f"{name}: max|uaii cpu - mlx| / max|mlx| = {err:.2e}"
    if name in HALF:
        err = F.rel_err(got, F.mlx_logits(d, TOKENS, float32=True))
        assert err <= TOL, f"{name}: max|uaii cpu - mlx in float32| / max|mlx in float32| = {err:.2e}"


@pytest.fixture(scope="module")
def mlx_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The ``tiny`` fixture's llama (same seed) converted by mlx_lm.convert in float32, and 128 wide at 8 bits in
    groups of 32: 390 KB of weights, against 205 KB for the smallest streaming plan (arena, KV cache, two staging
    buffers), so the budget below streams (the 32-wide one, 29 KB, fits that whole); qwen3moe 128 wide at mlx-lm's
    defaults (4 bits, groups of 64). Tokenizer: words w0..w63 = ids."""
    import mlx_fixtures as F

    root = tmp_path_factory.mktemp("mlx")
    return {"float": F.save_mlx("llama", root / "float", quantize=False),
            "q8": F.save_mlx("llama", root / "q8", bits=8, group_size=32, hidden=128),
            "moe": F.save_mlx("qwen3moe", root / "moe", hidden=128)}


def _greedy(path: Path) -> list[int]:
    with Session(path, plan_cache=False) as s:
        return list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens)


def test_float_conversion_runs_like_its_safetensors_twin(tiny: Path, mlx_dirs: dict[str, Path]) -> None:
    assert _greedy(mlx_dirs["float"]) == _greedy(tiny)


@pytest.mark.parametrize("name", ["q8", "moe"])
def test_tokens_mapped_and_streamed_agree(mlx_dirs: dict[str, Path], name: str) -> None:
    """Dense layers, and (moe) QuantizedMoEExperts' banks streamed by expert through the expert cache."""
    d = mlx_dirs[name]
    with Session(d, plan_cache=False) as s:
        assert s.storage_stats()["mode"] == "mmap"
        want = list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens)
        assert s.model_info is not None
        weight_bytes = int(s.model_info.weight_bytes)
    # half the weights pinned or streamed, plus room for the arena, the KV cache and staging (as the PyTorch test)
    with Session(d, plan_cache=False, budget_bytes=weight_bytes // 2 + 70_000, max_context=64, max_batch=16) as s:
        assert s.streaming and s.storage_stats()["mode"] == "streaming"
        assert list(s.generate(PROMPT, max_new_tokens=10, ignore_eos=True).tokens) == want
        assert s.storage_stats()["bytes_read"] > 0


def test_uaii_run_generates_from_an_mlx_directory(mlx_dirs: dict[str, Path], capsys: Any) -> None:
    d = mlx_dirs["q8"]
    text = " ".join(f"w{i}" for i in PROMPT)
    with Session(d, plan_cache=False, kv_dtype="f16", kv_window=0) as s:
        want = list(s.generate(text, max_new_tokens=8).tokens)
    code = main(["run", str(d), "-p", text, "-n", "8", "--json", "--kv-window", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out)
    assert obj["tokens"] == want and 1 <= len(want) <= 8
