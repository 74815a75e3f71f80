"""Streaming execution under a memory budget: the same greedy tokens as the memory-mapped run, the measured bytes
read per token against the plan, the expert cache on a tiny MoE, peak RSS of a streaming process, and the budget
errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_scripts import load_script

from uaii.planner import BudgetError
from uaii.runtime import Session

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
PROMPT = "The capital of France is"
SMALL = {"max_context": 128, "max_batch": 32}  # KV cache and arena small enough for a 10 % budget


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_path: Path) -> tuple[int, list[int]]:
    """Weight bytes and the greedy tokens of the unbudgeted (memory-mapped) run."""
    with Session(smollm2_path, **SMALL) as s:
        assert s.storage_stats()["mode"] == "mmap" and not s.streaming
        assert s._exe.streaming is None  # unbudgeted: every weight bound once, no per-node acquisition
        assert s.model_info is not None
        return int(s.model_info.weight_bytes), list(s.generate(PROMPT, max_new_tokens=12).tokens)


@pytest.mark.parametrize("fraction", [0.5, 0.25, 0.10])
def test_smollm2_streams_under_a_budget_with_the_same_tokens(smollm2_path: Path, smollm2_reference: Any,
                                                             fraction: float, caplog: Any) -> None:
    weight_bytes, tokens = smollm2_reference
    budget = int(weight_bytes * fraction)
    with Session(smollm2_path, budget_bytes=budget, **SMALL) as s:
        assert s.streaming
        storage = s.plan.storage
        assert storage.streamed_bytes_per_token > 0
        assert storage.pinned_bytes + storage.staging_bytes + storage.kv_cache_bytes + s.plan.arena.size <= budget
        assert not [r for r in caplog.records if "not implemented" in r.getMessage()]
        res = s.generate(PROMPT, max_new_tokens=12)
        assert list(res.tokens) == tokens
        st = s.storage_stats()
        assert st["mode"] == "streaming" and st["bytes_read"] > 0 and st["read_gb_s"] > 0
        # after the first token: every decode pass reads what the plan streams (measured by the store)
        ideal = storage.streamed_bytes_per_token
        assert res.stats.bytes_read_per_token == pytest.approx(ideal, rel=0.05)
        before, relowered = st["bytes_read"], st["relowered"]
        more = s.generate(PROMPT, max_new_tokens=12)  # the prompt and its logits are kept: only decode passes
        after = s.storage_stats()
        assert more.stats.cached_tokens == len(res.prompt_tokens)
        passes = len(more.tokens) - 1  # the first token samples the kept logits; every other one is a pass
        assert (after["bytes_read"] - before) / passes == pytest.approx(ideal, rel=0.05)
        assert after["bytes_read_per_token"] == pytest.approx(ideal, rel=0.05)
        assert after["relowered"] == relowered  # steady state: the same staging addresses, nothing re-bound


def test_smollm2_tied_table_streams_by_rows_and_chunks(smollm2_path: Path, smollm2_reference: Any) -> None:
    """At 10 % the tied embedding/lm_head table (30 MB) is neither pinned nor staged whole: lookups read rows, the
    lm_head streams in row chunks of one staging buffer."""
    weight_bytes, _ = smollm2_reference
    with Session(smollm2_path, budget_bytes=int(weight_bytes * 0.10), **SMALL) as s:
        table = next(w for w in s.plan.storage.weights if w.ref.endswith("#token_embd.weight"))
        assert table.mode == "streamed"
        assert max(s.plan.storage.staging_buffers) < table.nbytes // 10
        chunks = s._exe.streaming.order
        assert sum("token_embd.weight@rows=" in r for r in chunks) > 10


def test_f16_kv_cache_halves_the_kv_part_of_the_plan_with_the_same_tokens(smollm2_path: Path,
                                                                          smollm2_reference: Any) -> None:
    """kv_dtype="f16": keys and values cached in half precision (attention still computes in float32). The plan
    counts 2 bytes per element, so a 10 % budget holds a longer context; greedy tokens stay those of f32."""
    import numpy as np

    from uaii.runtime import SessionError

    weight_bytes, tokens = smollm2_reference
    budget = int(weight_bytes * 0.10)
    with Session(smollm2_path, budget_bytes=budget, **SMALL) as s32:
        kv32 = s32.plan.storage.kv_cache_bytes
        logits32 = s32.forward(s32.tokenize(PROMPT))
    with Session(smollm2_path, budget_bytes=budget, kv_dtype="f16", **SMALL) as s:
        assert s._kv.dtype == "f16" and s.plan.storage.kv_cache_bytes * 2 == kv32
        assert s._kv.nbytes == s.plan.storage.kv_cache_bytes
        logits16 = s.forward(s.tokenize(PROMPT))
        # rounding keys and values to half precision moves SmolLM2's logits by up to ~2 (of a ~30 spread): the
        # same top token, and the same greedy continuation below
        assert logits16.argmax() == logits32.argmax() and np.corrcoef(logits16, logits32)[0, 1] > 0.99
        s.reset()
        assert list(s.generate(PROMPT, max_new_tokens=12).tokens) == tokens
    with pytest.raises(SessionError, match="kv_dtype must be one of f32, f16"):
        Session(smollm2_path, kv_dtype="bf16")


def test_full_budget_spreads_streamed_weights_and_wraps_around_before_the_lm_head(smollm2_path: Path,
                                                                                  smollm2_reference: Any) -> None:
    """At 100 % of the weight bytes some weights still stream (the KV cache, arena and staging take part of the
    budget). They are whole steps spread evenly over the trunk (each read while pinned weights compute), their norm
    scales stay pinned, the staging pool reads ahead through the pinned lm_head, and the next run's reads are queued
    right after the last streamed step, before the pinned lm_head computes."""
    weight_bytes, tokens = smollm2_reference
    with Session(smollm2_path, budget_bytes=weight_bytes, **SMALL) as s:
        storage = s.plan.storage
        streamed = sorted({int(w.group.split(".")[1]) for w in storage.weights if w.mode == "streamed"})
        assert streamed and streamed[0] <= 3 and streamed[-1] >= 26
        assert max(b - a for a, b in zip([streamed[0], *streamed], streamed, strict=False)) <= 4
        assert not [w for w in storage.weights if w.mode == "streamed" and "norm" in w.ref]
        largest = max(w.nbytes for w in storage.weights if w.mode == "streamed")
        assert storage.staging_bytes > 2 * largest  # read-ahead: more than two of its steps (the planner's tests)
        assert list(s.generate(PROMPT, max_new_tokens=12).tokens) == tokens
        decode = next(b for (shapes, batched), b in s._exe._bindings.items() if shapes == ((1,), (1,)) and not batched)
        at = decode.names.index("(prefetch of the next run)")
        assert decode.names[at - 1].startswith(f"blk.{streamed[-1]}.")
        assert decode.names[at + 1:] and all(not n.startswith("blk.") or n.startswith(f"blk.{streamed[-1]}.")
                                             for n in decode.names[at + 1:])
        assert s.storage_stats()["staging"]["staged"] > 0  # the next token's first streamed step is read ahead
        # a streamed [N, K] weight fits a staging buffer whole: no last chunk of a few rows read on its own
        assert not [r for r in s._exe.streaming.order if "@rows=" in r]


def test_lowering_streamed_nodes_does_not_copy_the_bindings_arrays(smollm2_path: Path,
                                                                    smollm2_reference: Any) -> None:
    """Each lowering of a streamed node (one per staging address set, kept while the node's variants live) once
    copied the binding's dict of every value's array: 6.5 MB of Python memory at a tenth of SmolLM2's weights."""
    import tracemalloc

    weight_bytes, tokens = smollm2_reference
    with Session(smollm2_path, budget_bytes=weight_bytes // 10, **SMALL) as s:
        tracemalloc.start()
        try:
            got = list(s.generate(PROMPT, max_new_tokens=4).tokens)
            snap = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert s._exe.streaming.relowered > 100  # every streamed node lowered over its staged bytes
    held = snap.filter_traces([tracemalloc.Filter(True, "*/uaii/backends/cpu/streaming.py")])
    assert sum(t.size for t in held.traces) < 1 << 20  # 6.5 MB with the copies, 0.3 MB without
    assert got == tokens[:4]


def test_a_budget_below_the_minimum_is_refused(smollm2_path: Path) -> None:
    with pytest.raises(BudgetError, match="memory budget of 1048576 bytes is too small"):
        Session(smollm2_path, budget_bytes=1 << 20, **SMALL)


# --- MoE -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # attention weights larger than the experts: streaming a layer with a cache of all its experts then costs less
    # than pinning it (the plan counts the expert cache in the budget; pinned banks need none)
    path = tmp_path_factory.mktemp("synth") / "moe.gguf"
    synth = load_script("bench/synth_gguf.py", "synth_gguf")
    return Path(synth.write_moe_gguf(path, 2, 512, 32, n_experts=8, top_k=2, vocab=768, qtype="q8_0", seed=5))


MOE_IDS = [1, 5, 9, 33, 70]
MOE_OPTS = {"max_context": 64, "max_batch": 16}


def test_moe_streams_top_k_experts_through_the_expert_cache(moe_path: Path) -> None:
    with Session(moe_path, **MOE_OPTS) as s:
        assert s.model_info is not None
        weight_bytes = s.model_info.weight_bytes
        want = list(s.generate(MOE_IDS, max_new_tokens=10, ignore_eos=True).tokens)
    # a cache of every expert: the second identical generation is served from memory
    big = 1 * MiB
    with Session(moe_path, budget_bytes=weight_bytes // 2 + big, expert_cache_bytes=big, **MOE_OPTS) as s:
        storage = s.plan.storage
        assert storage.expert_cache_bytes == big  # in the plan's total, and experts are not staged on top of it
        assert max(storage.staging_buffers) < big // 2
        assert (storage.pinned_bytes + storage.staging_bytes + storage.kv_cache_bytes + big + s.plan.arena.size
                <= weight_bytes // 2 + big)
        assert list(s.generate(MOE_IDS, max_new_tokens=10, ignore_eos=True).tokens) == want
        first = s.storage_stats()["expert_cache"]
        assert first["misses"] > 0 and set(first["per_layer"]) == {"0", "1"}
        s.reset()
        assert list(s.generate(MOE_IDS, max_new_tokens=10, ignore_eos=True).tokens) == want
        second = s.storage_stats()["expert_cache"]
        assert second["misses"] == first["misses"]  # every expert was cached the first time
        assert second["hits"] > first["hits"]
        assert second["used_bytes"] <= big
    # the smallest cache (one expert of each bank): exact top-k still, every repeat after an eviction is a miss
    with Session(moe_path, budget_bytes=weight_bytes // 2, **MOE_OPTS) as s:
        assert list(s.generate(MOE_IDS, max_new_tokens=10, ignore_eos=True).tokens) == want
        small = s.storage_stats()["expert_cache"]
        assert small["used_bytes"] <= small["budget_bytes"] < big and small["misses"] > first["misses"]
        assert small["budget_bytes"] == s.plan.storage.expert_cache_bytes  # the plan counts the cache it gets


@pytest.fixture(scope="module")
def moe_experts_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Experts ~90 % of the weights, as in real MoE checkpoints: under half the weights as a budget the dense
    weights are pinned and the expert cache gets the rest."""
    path = tmp_path_factory.mktemp("synth") / "moe_experts.gguf"
    synth = load_script("bench/synth_gguf.py", "synth_gguf")
    return Path(synth.write_moe_gguf(path, 2, 256, 256, n_experts=16, top_k=2, vocab=768, qtype="q8_0", seed=5))


def test_the_auto_expert_cache_makes_room_for_sequences_and_the_batched_pass(moe_experts_path: Path) -> None:
    """Under a budget the expert cache is what the budget leaves (expert_cache_bytes 0): it must give back what
    more sequences and the batched executable need, or a second sequence would never be admitted and batched
    decode would be refused (decoding one sequence per pass, every dense weight read once per sequence). It
    shrinks by what is missing, the batched pass runs, tokens are each sequence's own, the session stays in its
    budget, and released sequences' bytes go back to the cache."""
    with Session(moe_experts_path, **MOE_OPTS) as s:
        assert s.model_info is not None
        budget = s.model_info.weight_bytes // 2
        prompts = [MOE_IDS, MOE_IDS[::-1], [2, 4, 6], [7, 7, 8, 9]]
        solo = [list(s.generate(p, max_new_tokens=6, ignore_eos=True).tokens) for p in prompts]
    with Session(moe_experts_path, budget_bytes=budget, **MOE_OPTS) as s:
        cache = s.storage_stats()["expert_cache"]
        planned = cache["budget_bytes"]
        assert planned == s.plan.storage.expert_cache_bytes and s.memory_bytes() > budget - s.sequence_bytes
        assert s.sequence_fits()  # the cache gave a sequence's KV state back
        seqs = [s.new_sequence() for _ in prompts]
        logits = [s.prefill(q, p) for q, p in zip(seqs, prompts, strict=True)]
        out: list[list[int]] = [[int(np.argmax(x))] for x in logits]
        for _ in range(5):
            rows = s.decode(seqs, [o[-1] for o in out])
            assert s.batched_decode  # one pass for the four: the batched executable fit
            for o, row in zip(out, rows, strict=True):
                o.append(int(np.argmax(row)))
        assert out == solo
        shrunk = s.storage_stats()["expert_cache"]["budget_bytes"]
        assert shrunk < planned and s.memory_bytes() <= budget
        for q in seqs:
            s.release(q)
        back = s.storage_stats()["expert_cache"]["budget_bytes"]
        assert shrunk < back <= planned and s.memory_bytes() <= budget


# --- peak RSS ---------------------------------------------------------------------------------------------------
_BASELINE = """
import json, uaii.runtime, uaii.backends, uaii.planner, uaii.storage, uaii.loaders, uaii.tokenizers, uaii.kernels
from uaii.backends import select_device
select_device("cpu")
def kib(f):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(f + ":"))
print(json.dumps({"peak": kib("VmHWM")}))
"""

_STREAMING = """
import json, sys
from uaii.runtime import Session
def kib(f):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(f + ":"))
path, budget = sys.argv[1], int(sys.argv[2])
with Session(path, budget_bytes=budget, max_context=128, max_batch=32) as s:
    res = s.generate("The capital of France is", max_new_tokens=8)
    mode = s.storage_stats()["mode"]
print(json.dumps({"peak": kib("VmHWM"), "tokens": list(res.tokens), "mode": mode}))
"""


def _child(code: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_peak_rss_of_a_streaming_run_stays_within_the_budget(smollm2_path: Path, smollm2_reference: Any) -> None:
    """Bound: peak RSS <= budget + baseline + 64 MiB, where the baseline is the peak RSS of a process that imported
    the runtime, loaders, tokenizers, planner, storage and kernels (the code, no model), measured here. The 64 MiB
    slack covers what the budget does not: the loaded graph and tokenizer objects (SmolLM2: a 49k-entry vocabulary
    and merges), the plan, Python allocations of the run, and the embedding row buffers."""
    weight_bytes, tokens = smollm2_reference
    budget = weight_bytes // 4
    base = _child(_BASELINE)["peak"]
    run = _child(_STREAMING, str(smollm2_path), str(budget))
    assert run["mode"] == "streaming" and run["tokens"][:8] == tokens[:8]
    assert run["peak"] <= budget + base + 64 * MiB, (run["peak"] / MiB, budget / MiB, base / MiB)
    assert run["peak"] - base < weight_bytes  # the whole model was never resident


def test_run_on_the_functional_graph_streams_too(smollm2_path: Path, smollm2_reference: Any) -> None:
    import numpy as np

    weight_bytes, _ = smollm2_reference

    def feeds(s: Session) -> dict[str, Any]:
        g = s._bundle.graph
        out: dict[str, Any] = {"tokens": np.array([1, 5, 9], np.int64), "positions": np.arange(3)}
        for n in g.inputs:
            if n.startswith("past_"):
                shape = g.tensor(n).shape
                out[n] = np.zeros((0, shape[1], shape[2]), np.float32)
        return out

    with Session(smollm2_path, **SMALL) as s:
        want = s.run(feeds(s))["logits"]
    with Session(smollm2_path, budget_bytes=weight_bytes // 3, **SMALL) as s:
        assert s.streaming
        np.testing.assert_array_equal(s.run(feeds(s))["logits"], want)
