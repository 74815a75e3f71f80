"""The planner on the real models of shared/MODELS.md, as the loaders compile them: fusion finds every layer's
patterns, the fused graph validates, the arena reuses memory and the storage plan holds its budget.

Moved from tests/planner: uaii-planner does not depend on uaii-loaders; uaii-runtime depends on both."""

from __future__ import annotations

from pathlib import Path

import pytest

from uaii import loaders
from uaii.planner import PlannerOptions, memory_report, overlapping_slots, plan, summarize

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own plan cache folder: the first plan of a model is a miss, the real ~/.cache untouched."""
    root = tmp_path / "uaii-cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(root))
    return root


def test_smollm2_plan(smollm2_path: Path) -> None:
    model = loaders.load_model(smollm2_path)
    n = model.config.n_layers
    opts = PlannerOptions(max_tokens=256, budget_bytes=64 * MiB, pin_layers=2, kv_cache_bytes=8 * MiB)
    p, hit = plan(model.graph, opts)
    assert not hit
    kernels = [s.kernel for s in p.steps]
    assert kernels.count("GroupedMatMul/1/q4_1") == 2 * n  # q/k/v and gate/up in every layer
    assert sum(k.startswith("AddRMSNorm/") for k in kernels) == 2 * n
    assert sum(k.startswith("SwiGLU/") for k in kernels) == n
    assert overlapping_slots(p.arena) == []
    report = memory_report(p.arena)
    assert report.arena_bytes * 20 < report.intermediate_bytes
    s = summarize(p)
    assert s["total_bytes"] <= 64 * MiB and s["staging_bytes"] > 0
    modes = {g["group"]: g["mode"] for g in s["groups"]}
    # blk.2 streams but its norm scales (small vectors) stay pinned
    assert modes["embed"] == modes["blk.0"] == modes["blk.1"] == "pinned" and modes["blk.2"] == "mixed"
    blk2 = [w for w in p.storage.weights if w.group == "blk.2"]
    assert {w.mode for w in blk2 if w.nbytes > 64 * 1024} == {"streamed"}
    assert "lm_head" not in modes  # tied to the embeddings: one table, counted once
    again, hit = plan(model.graph, opts)
    assert hit and again == p


def test_gemma3_plan_fits_a_tight_budget(gemma3_path: Path) -> None:
    model = loaders.load_model(gemma3_path)
    roomy, _ = plan(model.graph, PlannerOptions(max_tokens=64), cache=False)
    assert {w.mode for w in roomy.storage.weights} == {"mmap"}
    p, _ = plan(model.graph, PlannerOptions(max_tokens=64, budget_bytes=200 * MiB, pin_layers=4), cache=False)
    s = summarize(p)
    assert s["total_bytes"] <= 200 * MiB
    assert sum(g["mode"] in ("streamed", "mixed") for g in s["groups"]) > 0
    assert s["streamed_bytes_per_token"] > 0
