"""plan(): steps and kernel ids, placement, options, the plan key and the disk cache (hits, corrupt entries,
atomic writes, status and clear on real files)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from planner_helpers import Builder, Dims, llama

from uaii.ir import ValidationError
from uaii.ir.plan import ExecutionPlan, Step
from uaii.planner import (
    PlanCache,
    PlannerError,
    PlannerOptions,
    build_plan,
    clear,
    fuse,
    plan,
    plan_key,
    status,
    summarize,
)
from uaii.planner import check as check_module
from uaii.planner import planner as planner_module

Q = Dims(d=256, heads=4, kv=2, head_dim=64, ff=512, vocab=1000)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the real planning runs behind plan(): calls of the builder that a miss and build_plan share."""
    calls: list[str] = []
    real = planner_module._build

    def counted(*args: object, **kw: object) -> ExecutionPlan:
        calls.append("build")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(planner_module, "_build", counted)
    return calls


# --- steps ----------------------------------------------------------------------------------------------------
def test_one_step_per_fused_node_with_kernel_ids_and_resolved_attributes() -> None:
    g = llama(2, dims=Q, wdtype="q4_k")
    p, hit = plan(g, cache=False)
    fused = fuse(g)
    assert not hit and [s.node for s in p.steps] == [n.name for n in fused.nodes]
    kernels = {s.node: s.kernel for s in p.steps}
    assert kernels["blk.0.q/GroupedMatMul"] == "GroupedMatMul/1/q4_k"
    assert kernels["blk.0.attn_out/MatMul"] == "MatMul/1/q4_k"
    assert kernels["embd/Embedding"] == "Embedding/1/f32"
    assert kernels["blk.0.ffn_glu/SwiGLU"] == "SwiGLU/1/f32"
    assert kernels["blk.0.ffn_norm/AddRMSNorm"] == "AddRMSNorm/1/f32"
    step = next(s for s in p.steps if s.node == "blk.0.q.rope/RoPE")
    attrs = dict(step.attributes)
    assert attrs["theta"] == 10000.0 and attrs["mode"] == "normal"  # schema defaults filled in
    assert {s.device for s in p.steps} == {"cpu"}
    declared = set(g.tensor_map)
    assert all(v in declared for s in p.steps for v in (*s.inputs, *s.outputs) if v)


def test_plan_round_trips_through_canonical_json() -> None:
    p, _ = plan(llama(2, dims=Q, wdtype="q4_k"), PlannerOptions(budget_bytes=64 << 20, pin_layers=1), cache=False)
    text = p.to_json()
    back = ExecutionPlan.from_json(text)
    assert back == p and back.to_json() == text
    assert back.storage.streamed_bytes_per_token > 0
    meta = dict(p.metadata)
    assert meta["fusion.passes"] == "glu,add_rms_norm,grouped_matmul"
    assert int(meta["arena.intermediate_bytes"]) > p.arena.size
    assert PlannerOptions.from_dict(json.loads(meta["planner.options"])) == PlannerOptions(budget_bytes=64 << 20,
                                                                                          pin_layers=1)


def test_placement_callback_chooses_devices_on_misses_and_hits(builds: list[str]) -> None:
    g = llama(1)

    def gpu_for_matmuls(step: Step) -> str:
        return "gpu:0" if step.kernel.startswith(("MatMul", "GroupedMatMul")) else "cpu"

    for want_hit in (False, True):
        p, hit = plan(g, placement=gpu_for_matmuls)
        assert hit is want_hit
        assert {s.node: s.device for s in p.steps}["blk.0.q/GroupedMatMul"] == "gpu:0"
        assert {s.node: s.device for s in p.steps}["embd/Embedding"] == "cpu"
    plain, hit = plan(g)
    assert hit and {s.device for s in plain.steps} == {"cpu"}  # the cache holds the default device
    assert builds == ["build"]


def test_invalid_graph_is_rejected_before_planning() -> None:
    b = Builder()
    x = b.input("x", "f32", [2, 8])
    b.outputs.append(b.op("Relu", [x], [("y", "f32", [2, 9])]))
    with pytest.raises(ValidationError, match="declared"):
        plan(b.build(), cache=False)


def test_options_are_checked() -> None:
    with pytest.raises(PlannerError, match="alignment must be a power of two"):
        PlannerOptions(alignment=48)
    with pytest.raises(PlannerError, match="max_tokens must be an int >= 1"):
        PlannerOptions(max_tokens=0)
    with pytest.raises(PlannerError, match="stream_unit"):
        PlannerOptions(stream_unit="row")
    with pytest.raises(PlannerError, match="unknown planner option"):
        PlannerOptions.from_dict({"budget": 1})
    a = PlannerOptions(dim_bounds={"past": 8, "batch": 1}, persistent=("b", "a", "b"))
    assert a.dim_bounds == (("batch", 1), ("past", 8)) and a.persistent == ("a", "b")
    assert a.to_json() == PlannerOptions.from_dict(json.loads(a.to_json())).to_json()


# --- the key and the cache ------------------------------------------------------------------------------------
def test_key_covers_graph_options_and_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    g = llama(1)
    k = plan_key(g, PlannerOptions())
    assert len(k) == 64 and k == plan_key(llama(1), PlannerOptions())
    assert k != plan_key(llama(2), PlannerOptions())
    assert k != plan_key(g, PlannerOptions(max_tokens=1024))
    assert k != plan_key(g, PlannerOptions(passes=("glu",)))
    monkeypatch.setattr(planner_module, "package_versions", lambda: {"uaii-ir": "9.9", "uaii-planner": "9.9"})
    assert k != plan_key(g, PlannerOptions())


def test_key_covers_the_planner_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """A development checkout changes planning rules without a version bump: a plan cached before must miss."""
    g = llama(1)
    digest = planner_module.source_digest()
    assert len(digest) == 64 and digest == planner_module.source_digest()
    k = plan_key(g, PlannerOptions())
    monkeypatch.setattr(planner_module, "source_digest", lambda: "0" * 64)
    assert k != plan_key(g, PlannerOptions())


def test_second_plan_is_a_cache_hit_that_skips_planning(builds: list[str], _cache_dir: Path) -> None:
    g = llama(2)
    first, hit1 = plan(g, PlannerOptions(max_tokens=64))
    second, hit2 = plan(g, PlannerOptions(max_tokens=64))
    assert (hit1, hit2) == (False, True) and first == second and builds == ["build"]
    assert (_cache_dir / "plans" / f"{first.key}.json").read_text() == first.to_json()
    _, hit3 = plan(g, PlannerOptions(max_tokens=32))  # other options: another entry
    assert not hit3 and builds == ["build", "build"]
    _, hit4 = plan(g, PlannerOptions(max_tokens=64), cache=False)
    assert not hit4 and len(builds) == 3


@pytest.mark.parametrize("budget", [0, 1 << 20, 1 << 40])  # none, under the ceiling (2.7 MB), above it
def test_each_plan_call_fuses_and_derives_once(budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ceiling, the check of a hit and the build of a miss share one derivation of the fused graph."""
    calls: list[str] = []

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            calls.append(name)
            return real(*args, **kw)
        return call

    monkeypatch.setattr(planner_module, "fuse", counted("fuse", planner_module.fuse))
    for module in (planner_module, check_module):
        monkeypatch.setattr(module, "derive", counted("derive", module.derive))
    g, opts = llama(2, dims=Q, wdtype="q4_k"), PlannerOptions(max_tokens=16, budget_bytes=budget)
    for want_hit in (False, True):
        calls.clear()
        p, hit = plan(g, opts)
        assert hit is want_hit and sorted(calls) == ["derive", "fuse"]
    assert p == plan(g, opts, cache=False)[0] == build_plan(g, opts, key=p.key)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_key", "not_utf8", "empty"])
def test_corrupt_entry_is_rebuilt_and_overwritten(builds: list[str], _cache_dir: Path, damage: str) -> None:
    g = llama(1)
    good, _ = plan(g)
    path = _cache_dir / "plans" / f"{good.key}.json"
    text = path.read_text()
    broken = {
        "truncate": text[: len(text) // 2].encode(),
        "garbage": b'{"format_version": 1, "steps": 3}',
        "other_key": text.replace(good.key, "0" * 64).encode(),
        "not_utf8": b"\xff\xfe" + text.encode(),
        "empty": b"",
    }[damage]
    path.write_bytes(broken)
    again, hit = plan(g)
    assert not hit and again == good and builds == ["build", "build"]
    assert path.read_text() == text  # overwritten with the good entry
    assert plan(g)[1] is True


def test_unreadable_cache_folder_still_plans(builds: list[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = PlanCache(blocker / "plans")
    p, hit = plan(llama(1), cache=cache)
    assert not hit and p.steps and cache.status().entries == 0


def test_writes_are_atomic_and_leave_no_temporary_files(_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = llama(1)
    p, _ = plan(g)
    folder = _cache_dir / "plans"
    assert sorted(os.listdir(folder)) == [f"{p.key}.json"]
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        replaced.append((os.path.dirname(src), os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    p2, _ = plan(g, PlannerOptions(max_tokens=8))
    assert replaced and replaced[0][0] == str(folder) and replaced[0][1].startswith(".tmp-")
    # a failing write removes its temporary file and keeps the old entry
    monkeypatch.setattr(os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError("disk full")))
    entry = folder / f"{p.key}.json"
    before = entry.read_bytes()
    with pytest.raises(OSError, match="disk full"):
        PlanCache().store(p)
    assert entry.read_bytes() == before
    assert sorted(os.listdir(folder)) == sorted([f"{p.key}.json", f"{p2.key}.json"])


def test_status_and_clear_work_on_real_entries(_cache_dir: Path) -> None:
    assert status().entries == 0 and status().total_bytes == 0
    assert status().path == str(_cache_dir / "plans")
    keys = {plan(llama(1), PlannerOptions(max_tokens=n))[0].key for n in (8, 16, 32)}
    st = status()
    files = list((_cache_dir / "plans").glob("*.json"))
    assert st.entries == 3 == len(files) and {f.stem for f in files} == keys
    assert st.total_bytes == sum(f.stat().st_size for f in files)
    (_cache_dir / "plans" / ".tmp-abandoned.json").write_text("half")
    assert status().entries == 3  # a leftover of an interrupted write is not an entry
    assert clear() == 3
    assert status().entries == 0 and list((_cache_dir / "plans").iterdir()) == []
    assert clear() == 0


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "elsewhere"))
    plan(llama(1))
    assert status().entries == 1 and (tmp_path / "elsewhere" / "plans").is_dir()
    monkeypatch.delenv("UAII_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert PlanCache().directory == tmp_path / "home" / ".cache" / "uaii" / "plans"


def test_summarize_of_a_cached_plan() -> None:
    g = llama(2, dims=Q, wdtype="q4_k")
    opts = PlannerOptions(budget_bytes=64 << 20, pin_layers=1, kv_cache_bytes=1 << 20)
    built, _ = plan(g, opts)
    cached, hit = plan(g, opts)
    assert hit and summarize(cached) == summarize(built)
    s = summarize(cached)
    assert s["total_bytes"] == s["pinned_bytes"] + s["staging_bytes"] + (1 << 20) + cached.arena.size
    json.dumps(s)  # plain data
