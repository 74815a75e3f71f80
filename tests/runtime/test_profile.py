"""Decode profiles through the Session and ``uaii bench --profile`` on SmolLM2: per-step timing of the real decode,
its families and weight bytes, tokens unchanged; refused on a backend that does not declare step profiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import uaii.backends
from uaii.backends import CpuBackend
from uaii.runtime import Session, SessionError
from uaii.runtime.cli import main

IDS = [1, 504, 3458, 282, 5248, 30, 2115, 28, 253, 1345, 4390, 30]


def test_a_profiled_decode_times_every_step_and_keeps_the_tokens(smollm2_path: Path) -> None:
    with Session(smollm2_path, n_threads=2) as s:
        plain = list(s.generate(IDS, max_new_tokens=9, ignore_eos=True).tokens)
        s.reset()
        s.set_profiling(True)
        timed = list(s.generate(IDS, max_new_tokens=9, ignore_eos=True).tokens)
        profiles = s.take_profile()
        s.set_profiling(False)
        s.reset()
        s.generate(IDS, max_new_tokens=3, ignore_eos=True)
        assert s.take_profile() == []  # off: nothing recorded
        graph = s.graph
    assert timed == plain
    by_rows = {p.rows: p for p in profiles}
    assert set(by_rows) == {1, len(IDS)}  # the decode steps and the one prefill pass
    decode = by_rows[1]
    assert decode.runs == 8  # 9 tokens: the first comes from the prefill's logits
    fams = {f.family: f for f in decode.families()}
    assert {"gemm q4_1", "gemm q8_0", "Attention"} <= set(fams)
    assert fams["Attention"].nodes == 30 and fams["Attention"].weight_bytes == 0
    # every product family reads its weights whole: their bytes are the model's product weights
    products = sum(f.weight_bytes for name, f in fams.items() if name.startswith("gemm"))
    weights = {t.name: t for t in graph.tensors if t.is_weight}
    product_weights = {i for n in graph.nodes if n.op in ("MatMul", "GroupedMatMul") for i in n.inputs if i in weights}
    sizes = {n: t.dtype.nbytes(int(np.prod([int(d) for d in t.shape]))) for n, t in weights.items()}
    assert products == sum(sizes[n] for n in product_weights)
    assert decode.run_seconds >= decode.step_seconds > 0


def test_a_backend_without_step_profiles_is_refused_by_capability(smollm2_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    class NoProfile(CpuBackend):
        name = "noprofile"

        @property
        def capabilities(self) -> Any:
            return replace(super().capabilities, step_profile=False)

    backend = NoProfile()
    monkeypatch.setattr(uaii.backends, "select_device", lambda d="auto": backend)
    with Session(smollm2_path) as s, pytest.raises(SessionError, match="'noprofile' does not time its steps"):
        s.set_profiling(True)


def test_bench_profile_json(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--no-color", "bench", str(smollm2_path), "--json", "--prompt-tokens", "48", "--gen-tokens", "12",
                 "--threads", "2", "--profile"])
    out = capsys.readouterr().out
    assert code == 0
    prof = json.loads(out)["profile"]
    assert prof["available"] and prof["tokens"] == 11 and prof["context"] == [48, 59] and prof["threads"] == 2
    fams = {f["family"]: f for f in prof["families"]}
    assert fams["gemm q4_1"]["gb_s"] > 0 and fams["gemm q4_1"]["x_copy"] > 0 and fams["Attention"]["gb_s"] is None
    assert prof["copy_gb_s"] > 0
    # the rows add up: kernels + executor = the run; + the session = the wall time per token
    assert sum(f["ms"] for f in prof["families"]) == pytest.approx(prof["kernels_ms"])
    assert prof["kernels_ms"] + prof["executor_ms"] == pytest.approx(prof["run_ms"])
    assert prof["run_ms"] <= prof["ms_per_token"] * 1.05


def test_bench_profile_table(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--no-color", "bench", str(smollm2_path), "--prompt-tokens", "24", "--gen-tokens", "6", "--threads",
                 "1", "--profile", "--warmup", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "decode profile: 5 tokens at context 24-29" in out and "1 threads" in out
    for row in ("gemm q4_1", "Attention", "executor (feeds, state, step loop)", "session (sampling", "copy bandwidth"):
        assert row in out


# ---------------------------------------------------------------------------------------------------- --batch
def test_bench_batch_json_decodes_the_sequences_together(smollm2_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--no-color", "bench", str(smollm2_path), "--json", "--prompt-tokens", "40", "--gen-tokens", "9",
                 "--threads", "2", "--batch", "3", "--profile"])
    obj = json.loads(capsys.readouterr().out)
    assert code == 0
    assert obj["batch"] == 3 and obj["batched_pass"] and obj["batch_decode_steps"] == 8
    assert obj["batch_decode_tok_s"] == pytest.approx(3 * obj["batch_per_sequence_tok_s"])
    assert obj["batch_ratio"] == pytest.approx(obj["batch_decode_tok_s"] / obj["decode_tok_s"])
    assert obj["batch_bytes_read_per_token"] is None  # mapped, nothing streamed (the auto budget holds SmolLM2)
    prof = obj["profile_batch"]
    assert prof["available"] and prof["rows"] == 3 and prof["tokens"] == 8 and prof["context"] == [40, 48]
    assert {"gemm q4_1", "Attention"} <= {f["family"] for f in prof["families"]}


def test_batch_prompts_differ_and_keep_their_length(smollm2_path: Path) -> None:
    from uaii.runtime.cli.bench import batch_prompt_ids, session_prompt_ids

    with Session(smollm2_path) as s:
        prompts = batch_prompt_ids(s, 30, 4)
        assert prompts[0] == session_prompt_ids(s, 30)  # the first is the single-sequence prompt
    assert [len(p) for p in prompts] == [30] * 4 and len({tuple(p) for p in prompts}) == 4


def test_bench_batch_under_a_budget_reads_each_streamed_byte_once_per_pass(smollm2_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Streamed, a pass reads the streamed weights once for all its sequences: bytes per generated token of a
    batch of 4 are about a quarter of one sequence's."""
    code = main(["--no-color", "bench", str(smollm2_path), "--json", "--prompt-tokens", "24", "--gen-tokens", "6",
                 "--threads", "2", "--batch", "4", "--budget", "64MiB", "--warmup", "0"])
    obj = json.loads(capsys.readouterr().out)
    assert code == 0 and obj["batched_pass"]
    single, batched = obj["bytes_read_per_token"], obj["batch_bytes_read_per_token"]
    assert single and batched and batched == pytest.approx(single / 4, rel=0.05)


def test_bench_batch_must_be_positive(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-color", "bench", str(smollm2_path), "--batch", "0"]) != 0
    assert "--batch must be >= 1" in capsys.readouterr().err
