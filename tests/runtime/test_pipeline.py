"""Pipeline-parallel stages (uaii.runtime.pipeline): SmolLM2, Gemma-3 and a tiny MoE split into 2 and 3 stages give
the single-process greedy tokens exactly — in this process (``pipeline_transport="local"``) and as Ray actors on a
local multi-node cluster (``ray.cluster_utils.Cluster``) — each stage under its own budget; a stage killed or stopped
mid-generation ends the generation with a clear error within the timeout, and nothing hangs."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from repo_scripts import load_script

from uaii.ir import UaiiError
from uaii.runtime import Session, SessionError

PROMPT = "The capital of France is"
OPTS: dict[str, Any] = {"max_context": 256, "max_batch": 64, "n_threads": 1, "plan_cache": False}
N = 20


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    synth = load_script("bench/synth_gguf.py", "synth_gguf")
    path = tmp_path_factory.mktemp("synth") / "moe.gguf"
    return Path(synth.write_moe_gguf(path, 3, 256, 32, n_experts=8, top_k=2, vocab=768, qtype="q8_0", seed=7))


def greedy(path: Path, prompt: Any = PROMPT, **options: Any) -> list[int]:
    with Session(path, **OPTS, **options) as s:
        return list(s.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens)


@pytest.fixture(scope="module")
def models(smollm2_path: Path, gemma3_path: Path, moe_path: Path) -> dict[str, tuple[Path, Any, list[int]]]:
    """name -> (path, prompt, the single-process greedy tokens)."""
    out = {}
    for name, path, prompt in (("smollm2", smollm2_path, PROMPT), ("gemma3", gemma3_path, PROMPT),
                               ("moe", moe_path, [1, 5, 9, 33, 70])):
        out[name] = (path, prompt, greedy(path, prompt))
    return out


# --- in this process -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "moe"])
def test_local_stages_give_the_single_process_tokens(models: dict, name: str, stages: int) -> None:
    path, prompt, want = models[name]
    with Session(path, pipeline=stages, pipeline_transport="local", **OPTS) as s:
        info = s.pipeline
        assert [i.index for i in info] == list(range(stages))
        assert info[0].first == 0 and all(a.last == b.first for a, b in pairwise(info))
        assert all(len(i.sends) == 1 for i in info[:-1])  # only the residual stream crosses
        assert list(s.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens) == want
        # a second turn reuses the stages' caches, and a sequence of its own runs beside it
        seq = s.new_sequence()
        ids = s.tokenize(prompt) if isinstance(prompt, str) else prompt
        logits = s.prefill(seq, ids)
        assert int(logits.argmax()) == want[0]
        assert [st["states"] for st in s._exe.stats()] == [2] * stages  # the session's own and the sequence's
        s.release(seq)
        assert [st["states"] for st in s._exe.stats()] == [1] * stages  # freed on every stage


def test_a_pass_a_later_stage_refuses_leaves_every_stage_as_it_was(smollm2_path: Path, models: dict,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage 0 has run its part when stage 1 raises: the pass fails, stage 0's cache is rewound with the rest, and
    the next generation gives the reference tokens (not a 'stages disagree' error, nor tokens after a stray one)."""
    with Session(smollm2_path, pipeline=2, pipeline_transport="local", **OPTS) as s:
        last = s._exe.stages.runners[1]
        real, calls = last.run, [0]

        def refuse_the_fifth(*args: Any) -> Any:
            calls[0] += 1
            if calls[0] == 5:
                raise SessionError("[runtime] refused for the test")
            return real(*args)

        monkeypatch.setattr(last, "run", refuse_the_fifth)
        with pytest.raises(SessionError, match="refused for the test"):
            s.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
        assert [st["states"] for st in s._exe.stats()] == [1, 1]
        assert s._exe.stages.runners[0].length(s._kv.ids[0]) == s._exe.stages.runners[1].length(s._kv.ids[1])
        assert list(s.generate(PROMPT, max_new_tokens=N, ignore_eos=True).tokens) == models["smollm2"][2]


def test_each_stage_plans_its_own_budget_and_streams_what_it_cannot_pin(smollm2_path: Path,
                                                                        models: dict) -> None:
    """A budget that holds about half of a stage's layers: every stage streams the rest, the tokens are the same."""
    with Session(smollm2_path, pipeline=2, pipeline_transport="local", budget_bytes=48 << 20, **OPTS) as s:
        for i in s.pipeline:
            assert i.mode == "streaming" and i.budget_bytes == 48 << 20
            assert 0 < i.pinned_bytes < i.weight_bytes and i.streamed_bytes_per_token > 0
        assert list(s.generate(PROMPT, max_new_tokens=N, ignore_eos=True).tokens) == models["smollm2"][2]


def test_explicit_starts_and_bad_options(smollm2_path: Path) -> None:
    with Session(smollm2_path, pipeline=3, pipeline_starts=(4, 20), pipeline_transport="local", **OPTS) as s:
        assert [(i.first, i.last) for i in s.pipeline] == [(0, 4), (4, 20), (20, 30)]
    with pytest.raises(SessionError, match="pipeline_starts gives 1 stage starts; 3 stages need 2"):
        Session(smollm2_path, pipeline=3, pipeline_starts=(4,), pipeline_transport="local")
    with pytest.raises(SessionError, match="pipeline_transport must be one of ray, local"):
        Session(smollm2_path, pipeline=2, pipeline_transport="tcp")
    with pytest.raises(UaiiError, match=r"ascending layers in 1\.\.29"):
        Session(smollm2_path, pipeline=2, pipeline_starts=(30,), pipeline_transport="local", **OPTS)
    with pytest.raises(SessionError, match="no step profile"), \
            Session(smollm2_path, pipeline=2, pipeline_transport="local", **OPTS) as s:
        s.set_profiling(True)


# --- on Ray --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Three Ray nodes on this machine (one CPU each), this process connected as the driver."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "object_store_memory": 80 << 20})
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=80 << 20)
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "moe"])
def test_ray_stages_on_their_own_nodes_give_the_single_process_tokens(cluster: Any, models: dict, name: str,
                                                                      stages: int) -> None:
    path, prompt, want = models[name]
    with Session(path, pipeline=stages, **OPTS) as s:
        pids = {h["pid"] for h in s._exe.stages.call("describe")}
        assert len(pids) == stages and os.getpid() not in pids  # one process per stage, none of them this one
        assert list(s.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens) == want
        stats = s._exe.stats()
        assert all(st["passes"] >= N for st in stats)


def test_more_stages_than_nodes_is_refused(cluster: Any, smollm2_path: Path) -> None:
    with pytest.raises(SessionError, match="4 pipeline stages run on 4 nodes, one each; the Ray cluster has 3 alive"):
        Session(smollm2_path, pipeline=4, **OPTS)


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_lost_stage_ends_the_generation_with_a_clear_error(cluster: Any, smollm2_path: Path, how: str) -> None:
    timeout = 6.0
    with Session(smollm2_path, pipeline=2, stage_timeout_s=timeout, **OPTS) as s:
        pid = s._exe.stages.call("describe")[1]["pid"]
        seen: list[int] = []

        def lose_stage_1(token: int, _: str) -> None:
            seen.append(token)
            if len(seen) == 3:
                os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)

        t0 = time.monotonic()
        want = "stage 1 .*died" if how == "killed" else rf"stage 1 \(on \S+\) did not answer within {timeout:g} s"
        try:
            with pytest.raises(SessionError, match=want):
                s.generate(PROMPT, max_new_tokens=N, ignore_eos=True, on_token=lose_stage_1)
            assert time.monotonic() - t0 < timeout + 20
            assert len(seen) == 3
            with pytest.raises(SessionError, match="the pipeline is broken"):
                s.generate(PROMPT, max_new_tokens=2)
        finally:
            if how == "stopped":
                os.kill(pid, signal.SIGCONT)
    # a new session takes the cluster's nodes again (the lost stage's actor was given up when the session closed)
    with Session(smollm2_path, pipeline=2, stage_timeout_s=timeout, **OPTS) as s:
        assert len(s.generate(PROMPT, max_new_tokens=3, ignore_eos=True).tokens) == 3


# --- the command line ----------------------------------------------------------------------------------------------
def test_cli_plan_and_run_with_pipeline_stages(smollm2_path: Path, models: dict,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from uaii.runtime.cli import main

    assert main(["plan", str(smollm2_path), "--pipeline", "2", "--budget-per-node", "60MiB", "--max-context", "256",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    stages = plan["stages"]
    assert [(s["first"], s["last"]) for s in stages] == [(0, 15), (15, 30)]
    assert all(s["budget_bytes"] == 60 << 20 and s["streamed_bytes_per_token"] > 0 for s in stages)
    assert stages[0]["sends_bytes_per_token"] == 576 * 4 and stages[1]["sends_bytes_per_token"] == 0
    # the same greedy text as one process, through `uaii run`
    want = Session(smollm2_path, **OPTS)
    try:
        text = want.generate(PROMPT, max_new_tokens=8, ignore_eos=True).text
    finally:
        want.close()
    assert main(["run", str(smollm2_path), "-p", PROMPT, "-n", "8", "--json", "--pipeline", "2", "--pipeline-local",
                 "--threads", "1", "--kv-dtype", "f32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] == text


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget-per-node", "1GiB"], "--budget-per-node apply only with --pipeline K"),
    (["--pipeline", "1"], "--pipeline must be >= 2"),
    (["--pipeline", "2", "--budget", "1GiB"], "with --pipeline give each stage's: --budget-per-node"),
    (["--pipeline", "2", "--pipeline-starts", "a,b"], "--pipeline-starts takes layer numbers"),
])
def test_cli_pipeline_flags_are_checked(smollm2_path: Path, argv: list[str], message: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from uaii.runtime.cli import main

    assert main(["run", str(smollm2_path), "-p", "x", *argv]) != 0
    assert message in capsys.readouterr().err


# --- served ----------------------------------------------------------------------------------------------------------
def test_the_server_runs_a_pipeline_session_for_concurrent_requests(cluster: Any, smollm2_path: Path) -> None:
    """`uaii serve --pipeline 2`: the engine's sequences each get a KV state on every stage (one pass per sequence:
    no batched decode across stages); three concurrent requests get the replies they get alone, and a finished
    request's states are freed on the stages."""
    import concurrent.futures

    import httpx
    from serve_support import running_server

    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    with Session(smollm2_path, **OPTS) as s:
        want = s.generate(PROMPT, max_new_tokens=8).text
    with running_server(model=smollm2_path, session_options={**OPTS, "pipeline": 2}) as url:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            replies = list(pool.map(lambda _: httpx.post(f"{url}/v1/completions", json=body, timeout=120), range(3)))
        assert [r.status_code for r in replies] == [200] * 3
        assert [r.json()["choices"][0]["text"] for r in replies] == [want] * 3
