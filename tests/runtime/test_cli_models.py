"""The `uaii` command line on the real SmolLM2-135M (fetched once into the model cache, see tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import uaii.runtime
from uaii.runtime.cli import main

needs_session = pytest.mark.skipif(not hasattr(uaii.runtime, "Session"), reason="uaii.runtime.Session not built")


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))  # plans in a temp cache; the model fixture
    monkeypatch.delenv("UAII_DEBUG", raising=False)                 # has already resolved its path


def run_json(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@needs_session
def test_run_greedy_json_is_deterministic(smollm2_path: Path, capsys):
    argv = ["run", smollm2_path, "-p", "The capital of France is", "--temp", "0", "-n", "8", "--json",
            "--threads", "2"]
    first = run_json(argv, capsys)
    second = run_json(argv, capsys)
    assert len(first["tokens"]) == 8 and first["finish_reason"] == "length"
    assert first["tokens"] == second["tokens"] and first["text"] == second["text"]
    assert first["prompt_tokens"] and first["decode_tok_s"] > 0 and first["peak_rss_bytes"] > 0
    assert "Paris" in first["text"]


@needs_session
def test_run_streams_and_reports(smollm2_path: Path, capsys):
    code = main(["run", str(smollm2_path), "--chat", "-p", "Say hello.", "-n", "12", "--threads", "2"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip()
    assert "decode" in err and "tok/s" in err and "preset auto" in err


@needs_session
def test_run_on_a_corrupt_gguf_is_one_line(tmp_path: Path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    code = main(["run", str(bad), "-p", "x"])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.startswith("error: [") and err.count("\n") == 1


def test_tokenize_detokenize_round_trip(smollm2_path: Path, capsys):
    text = "Hello, world! Ünïcödé and numbers 12345."
    tok = run_json(["tokenize", smollm2_path, text, "--json"], capsys)
    assert tok["count"] == len(tok["ids"]) == len(tok["pieces"]) > 5
    back = run_json(["detokenize", smollm2_path, ",".join(map(str, tok["ids"])), "--json"], capsys)
    assert back["text"] == text
    code = main(["detokenize", str(smollm2_path), *map(str, tok["ids"])])
    assert code == 0 and capsys.readouterr().out == text + "\n"


def test_detokenize_out_of_range(smollm2_path: Path, capsys):
    code = main(["detokenize", str(smollm2_path), "1,99999999"])
    err = capsys.readouterr().err
    assert code == 1 and "out of range" in err and "49152" in err


def test_inspect_json_reports_llama_and_its_quant_mix(smollm2_path: Path, capsys):
    d = run_json(["inspect", smollm2_path, "--json"], capsys)
    assert d["architecture"] == "llama" and d["format"] == "gguf"
    assert d["quant_mix"]["Q4_1"]["count"] == 210 and d["quant_mix"]["Q8_0"]["count"] == 1
    assert d["config"]["n_layers"] == 30 and d["config"]["vocab_size"] == 49152
    assert 130e6 < d["n_params"] < 140e6
    assert d["memory"]["kv_bytes_per_1k_tokens_f32"] == 2 * 30 * 3 * 64 * 1024 * 4
    full = run_json(["inspect", smollm2_path, "--json", "--all"], capsys)
    assert len(full["tensors"]) == 272 and "tokenizer.ggml.tokens" in full["metadata"]


def test_inspect_table(smollm2_path: Path, capsys):
    assert main(["inspect", str(smollm2_path)]) == 0
    out = capsys.readouterr().out
    assert "Q4_1" in out and "blk.*.ffn_up.weight" in out and "KV cache per 1k tokens" in out


@pytest.mark.parametrize("suffix", [".uaii", ".uaii.json"])
def test_convert_writes_a_graph_that_loads(smollm2_path: Path, tmp_path: Path, suffix: str, capsys):
    from uaii.ir import load

    out = tmp_path / f"smollm2{suffix}"
    assert main(["convert", str(smollm2_path), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    graph = load(out)
    assert len(graph.nodes) > 100
    assert main(["convert", str(smollm2_path), str(out)]) == 1  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["convert", str(smollm2_path), str(tmp_path / "x.bin")]) == 1
    assert "extension" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temp files left behind


def test_plan_fills_the_plan_cache(smollm2_path: Path, capsys):
    first = run_json(["plan", smollm2_path, "--budget", "120MiB", "--json"], capsys)
    assert first["budget_bytes"] == 120 << 20 and first["streamed_bytes_per_token"] > 0
    assert first["cache_hit"] is False
    assert run_json(["plan", smollm2_path, "--budget", "120MiB", "--json"], capsys)["cache_hit"] is True
    status = run_json(["cache", "status", "--json"], capsys)
    assert status["entries"] == 1 and status["total_bytes"] > 0
    assert run_json(["cache", "clear", "--json"], capsys)["removed"] == 1
