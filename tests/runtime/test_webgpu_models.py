"""Real models through the webgpu backend on whatever adapter exists (lavapipe in CI): SmolLM2 and Gemma-3 from
their GGUFs give the CPU backend's greedy tokens, or part from them only at a step where the CPU's top-1/top-2
logit gap is below 0.5 (there the two f32 orders of summation may rightly disagree)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from uaii.runtime import Session

pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")

from uaii.backends.webgpu import WebGpuBackend

STATUS = WebGpuBackend(allow_software=True).probe()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"no WebGPU adapter: {STATUS.reason}")

N_NEW = 32
GAP = 0.5
PROMPT = "The capital of France is"


def greedy(session: Session, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and, per step, the top-1/top-2 logit gap the token was chosen with."""
    tokens, gaps = [], []
    logits = session.forward(prompt)
    for _ in range(n):
        top2 = np.partition(logits, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
        t = int(np.argmax(logits))
        tokens.append(t)
        logits = session.forward([t])
    return tokens, gaps


def assert_same_greedy(cpu: tuple[list[int], list[float]], gpu: list[int]) -> None:
    tokens, gaps = cpu
    for i, (a, b) in enumerate(zip(tokens, gpu, strict=True)):
        if a != b:
            assert gaps[i] < GAP, (f"step {i}: webgpu chose {b}, the cpu {a} with a top-1/top-2 gap of {gaps[i]:.3f} "
                                   f">= {GAP}; cpu {tokens}, webgpu {gpu}")
            return


CpuRuns = dict[tuple[Path, str], tuple[list[int], tuple[list[int], list[float]]]]


@pytest.fixture(scope="module")
def cpu_greedy() -> CpuRuns:
    """The CPU backend's prompt ids and greedy run per model file and preset (computed once per module)."""
    return {}


def cpu_run(path: Path, cache: CpuRuns, preset: str = "") -> tuple[list[int], tuple[list[int], list[float]]]:
    if (path, preset) not in cache:
        with Session(path, plan_cache=False, **({"preset": preset} if preset else {})) as s:
            prompt = s.tokenizer.encode(PROMPT)
            cache[path, preset] = (prompt, greedy(s, prompt, N_NEW))
    return cache[path, preset]


# Gemma-3 runs under the budget only: its ops are the same resident and streamed, and its three runs on lavapipe
# took 4 of CI's minutes; SmolLM2 covers resident vs streamed.
@pytest.mark.parametrize("model,budget", [("smollm2", 0), ("smollm2", 25), ("gemma3", 25)],
                         ids=["smollm2-resident", "smollm2-budget25", "gemma3-budget25"])
def test_greedy_tokens_match_the_cpu(model: str, budget: int, request: pytest.FixtureRequest,
                                     monkeypatch: pytest.MonkeyPatch, cpu_greedy: CpuRuns) -> None:
    """Resident, and under a device budget of 25 % of the weights (the rest streams to the device per step)."""
    monkeypatch.setenv("UAII_ALLOW_SOFTWARE_GPU", "1")
    path = request.getfixturevalue(f"{model}_path")
    prompt, cpu = cpu_run(path, cpu_greedy)
    options: dict[str, object] = {}
    if budget:  # a short context and batch, so that the KV cache and arena leave room for weights in 25 %
        options.update(max_context=256, max_batch=32)
        with Session(path, plan_cache=False) as s:
            weights = sum(t.dtype.nbytes(int(np.prod([int(d) for d in t.shape])))
                          for t in s.graph.tensors if t.is_weight)
        options["gpu_budget_bytes"] = weights * budget // 100
    with Session(path, device="webgpu", plan_cache=False, **options) as g:
        if budget:
            res = g.device_residency
            assert res is not None and res.streamed, "a 25 % device budget must stream weights"
            assert res.resident_bytes <= options["gpu_budget_bytes"]
        gpu, _ = greedy(g, prompt, N_NEW)
    assert_same_greedy(cpu, gpu)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_greedy_tokens_match_the_cpu_under_the_cli_preset(model: str, request: pytest.FixtureRequest,
                                                          monkeypatch: pytest.MonkeyPatch, cpu_greedy: CpuRuns) -> None:
    """What `uaii run MODEL --device webgpu --temp 0` runs: the auto preset (f16 KV cache, 2048-token window) on
    both backends."""
    monkeypatch.setenv("UAII_ALLOW_SOFTWARE_GPU", "1")
    path = request.getfixturevalue(f"{model}_path")
    prompt, cpu = cpu_run(path, cpu_greedy, "auto")
    with Session(path, device="webgpu", plan_cache=False, preset="auto") as g:
        assert g.options.kv_dtype == "f16"
        gpu, _ = greedy(g, prompt, N_NEW)
    assert_same_greedy(cpu, gpu)
