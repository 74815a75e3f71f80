"""The plan is what runs: each step carries the op and version of its fused node (plan format 2), a backend rebuilds
the plan's graph from them and never from the display string ``kernel``, and a cached plan of format 1 is a miss."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from planner_helpers import Builder, llama

from uaii.ir import Graph, OpSchema, Registry
from uaii.ir import registry as registry_module
from uaii.ir.ops import FLOATS, OpKind, Param, float_attr
from uaii.ir.ops.elementwise import same_shape
from uaii.ir.plan import ExecutionPlan
from uaii.planner import PlanCache, PlannerOptions, fuse, plan


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own plan cache folder: nothing is written to the real ~/.cache."""
    root = tmp_path / "uaii-cache"
    monkeypatch.setenv("UAII_CACHE_DIR", str(root))
    return root


def test_every_step_names_the_op_and_version_of_its_fused_node() -> None:
    g = llama(2)
    p, _ = plan(g, cache=False)
    fused = {n.name: n for n in fuse(g).nodes}
    assert [(s.op, s.version) for s in p.steps] == [(fused[s.node].op, fused[s.node].version) for s in p.steps]
    assert {s.op for s in p.steps} >= {"GroupedMatMul", "AddRMSNorm", "Embedding", "Attention"}


def _format_1(p: ExecutionPlan) -> str:
    """``p`` as plan format 1 wrote it: no op and version in the steps."""
    d = p.to_dict()
    d["format_version"] = 1
    for s in d["steps"]:
        del s["op"], s["version"]
    return json.dumps(d)


def test_a_cached_format_1_plan_is_a_miss_that_is_rebuilt_and_overwritten(
        _cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    g = llama(1)
    cache = PlanCache()
    good, _ = plan(g, cache=cache)
    entry = cache.path_for(good.key)
    entry.write_text(_format_1(good))
    assert cache.load(good.key) is None  # unreadable as a plan: a miss, no FormatError reaches the caller
    with caplog.at_level(logging.WARNING, logger="uaii.planner"):
        again, hit = plan(g, cache=cache)
    assert not hit and again == good
    assert json.loads(entry.read_text())["format_version"] == 2
    assert plan(g, cache=cache) == (good, True)


# --- an op whose name holds '/' (a plugin's vendor/Op): the plan's op field, not the kernel string ---------------
SCALE = OpSchema("vendor/Scale", 2, "Y = X * factor (a plugin op whose name holds a '/').",
                 inputs=(Param("X", "T"),), outputs=(Param("Y", "T"),),
                 attrs=(float_attr("factor", 1.0, "the scale"),), types={"T": FLOATS}, infer=same_shape,
                 kind=OpKind.UNARY)


def _graph() -> Graph:
    """vendor/Scale, then two MatMuls over its output (fused into one GroupedMatMul, so the plan's steps are not the
    graph's nodes and the backend must build its graph from the plan)."""
    b = Builder("slash")
    x = b.input("x", "f32", ["seq", 8])
    h = b.op("vendor/Scale", [x], [("h", "f32", ["seq", 8])], name="pre/scale", factor=0.5)
    b.nodes[-1] = replace(b.nodes[-1], version=2)
    for nm in ("a", "c"):
        b.outputs.append(b.op("MatMul", [h, b.weight(f"w.{nm}", "f32", [4, 8])], [(nm, "f32", ["seq", 4])],
                              name=f"proj/{nm}", transpose_b=True))
    return b.build()


@pytest.fixture()
def vendor_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """vendor/Scale registered in a registry of this test alone, with a CPU lowering."""
    cpu = pytest.importorskip("uaii.backends.cpu.executable")
    reg = Registry()
    reg.register(SCALE)
    monkeypatch.setattr(registry_module, "_DEFAULT", reg)

    def lower(b: Any, info: Any) -> list[Any]:
        x, y, f = b.a(info.node.inputs[0]), b.a(info.node.outputs[0]), float(info.attrs["factor"])

        def step() -> None:
            np.multiply(x, f, out=y)

        return [step]

    monkeypatch.setitem(cpu.GENERIC, SCALE.op, lower)


@pytest.mark.usefixtures("vendor_op")
def test_a_plan_whose_op_names_hold_a_slash_runs_as_planned() -> None:
    from uaii.backends import ArrayWeights, plan_graph
    from uaii.backends.cpu import CpuBackend

    g = _graph()
    from uaii.runtime.planning import arena_policy

    p, _ = plan(g, PlannerOptions(max_tokens=4), cache=False, arena=arena_policy(CpuBackend()))
    step = next(s for s in p.steps if s.node == "pre/scale")
    assert (step.op, step.version, step.kernel) == ("vendor/Scale", 2, "vendor/Scale/2/f32")
    assert [s.op for s in p.steps] == ["vendor/Scale", "GroupedMatMul"]
    node = next(n for n in plan_graph(g, p).nodes if n.name == "pre/scale")
    assert (node.op, node.version, node.get("factor")) == ("vendor/Scale", 2, 0.5)
    rng = np.random.default_rng(3)
    w = {f"w.{nm}": rng.standard_normal((4, 8)).astype(np.float32) for nm in ("a", "c")}
    exe = CpuBackend().compile(g, p, ArrayWeights({f"model.gguf#{k}": v for k, v in w.items()}), max_tokens=4,
                               kv_state=False)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    out = exe.run({"x": x})
    for nm in ("a", "c"):
        np.testing.assert_allclose(np.array(out[nm]), (x * 0.5) @ w[f"w.{nm}"].T, rtol=1e-5, atol=1e-5)
