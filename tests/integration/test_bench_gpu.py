"""The plumbing of bench/bench_gpu.py (`make bench-gpu`): a model or a weight type that fails is that row's error
and the rest still runs; ratios come from the same run; errors print as they are (no markup eaten); and a quick
GEMV-only run on whatever adapter exists (lavapipe in CI)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
from repo_scripts import load_script

bench = load_script("bench/bench_gpu.py", "bench_gpu")


def test_a_failing_model_or_device_is_a_row_not_a_crash() -> None:
    seen: list[list[str]] = []

    def runner(cmd: list[str], timeout: float) -> dict[str, Any]:
        seen.append(cmd)
        if "webgpu" in cmd:
            return {"error": "[internal] AttributeError: no lowering (UAII_DEBUG=1 shows the traceback)"}
        return {"prefill_tok_s": 400.0, "decode_tok_s": 100.0}

    def find(key: str) -> Path:
        if key == "gemma3":
            raise FileNotFoundError("gemma-3-270m-Q4_K_M.gguf is not in the cache")
        return Path("/models/smollm2.gguf")

    rows = bench.model_rows(["smollm2", "gemma3"], 16, 4, 60.0, find, runner)
    assert [(r["model"], r["device"], "error" in r) for r in rows] == [
        ("SmolLM2-135M Q4_1", "cpu", False), ("SmolLM2-135M Q4_1", "webgpu", True),
        ("Gemma-3-270M Q4_K_M", "cpu", True), ("Gemma-3-270M Q4_K_M", "webgpu", True)]
    assert "model not found: FileNotFoundError" in rows[2]["error"]
    cpu, gpu = seen
    assert cpu[cpu.index("--device") + 1] == "cpu" and "--allow-software-adapter" not in cpu
    assert gpu[gpu.index("--device") + 1] == "webgpu" and "--allow-software-adapter" in gpu
    for cmd in seen:  # the same prompt, tokens and KV cache on both devices
        assert cmd[cmd.index("--prompt-tokens") + 1] == "16" and cmd[cmd.index("--kv-dtype") + 1] == "f32"


def test_the_table_shows_errors_verbatim_and_ratios_against_the_cpu() -> None:
    rows = [{"model": "M", "device": "cpu", "prefill_tok_s": 400.0, "decode_tok_s": 100.0},
            {"model": "M", "device": "webgpu", "prefill_tok_s": 800.0, "decode_tok_s": 50.0},
            {"model": "N", "device": "webgpu", "error": "[internal] boom"}]
    out = io.StringIO()
    bench.render("webgpu:0 fake [x]", None, [], "", rows, out=out)
    text = out.getvalue()
    assert "2.00x" in text and "0.50x" in text
    assert "failed: [internal] boom" in text and "fake [x]" in text


class _Measure:
    @staticmethod
    def gemv_bandwidth(dev: Any, dtype: Any, n: int, k: int, reps: int) -> float:
        if dtype.value == "q6_k":
            raise RuntimeError("no q6_k kernel yet")
        return 2.0

    @staticmethod
    def copy_bandwidth(dev: Any, nbytes: int, reps: int) -> float:
        return 8.0


def test_gemv_rows_ratio_to_the_copy_and_errors_per_type() -> None:
    shapes = [("a", 576, 64), ("b", 512, 64)]
    rows = bench.gemv_rows(None, _Measure(), ["f16", "q6_k"], shapes, 1, 8.0)
    # q6_k has 256-element blocks: k = 576 is no weight of any model, so that shape has no row
    assert [(r["dtype"], r["shape"]) for r in rows] == [("f16", "a"), ("f16", "b"), ("q6_k", "b")]
    assert rows[0]["ratio"] == 0.25 and "no q6_k kernel yet" in rows[2]["error"]


def test_run_json_reads_the_last_line_or_the_error() -> None:
    ok = bench.run_json([sys.executable, "-c", "print('log'); print('{\"a\": 1}')"], 60)
    assert ok == {"a": 1}
    bad = bench.run_json([sys.executable, "-c", "import sys; sys.exit('error: [cli] nope')"], 60)
    assert bad == {"error": "[cli] nope"}


def test_a_quick_gemv_run_on_the_adapter_here(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    dev, why = bench.open_gpu()
    if dev is None:
        pytest.skip(f"no WebGPU adapter: {why}")
    code = bench.main(["--quick", "--no-models"])
    out = capsys.readouterr().out
    assert "adapter: webgpu:" in out and "buffer copy" in out and "GB/s" in out
    assert code == 0, out


def test_the_streaming_row_on_the_host_model_of_a_cuda_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """streaming_row (make bench-gpu's streaming figure, on SmolLM2 or the synthetic llama) on a small synthetic
    llama, cuda on the host model of a device: resident and streamed decode rates, the streamed bytes of a step
    (the device residency's) and their rate against the page-locked copy the caller measured."""
    pytest.importorskip("gguf")
    synth = load_script("bench/synth_gguf.py", "synth_gguf_for_bench_gpu")
    from uaii.backends import registry
    from uaii.backends.cuda.backend import CudaBackend
    from uaii.backends.cuda.host import HostDevice

    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=HostDevice(kernels="compiled")))
    path = synth.write_llama_gguf(tmp_path / "tiny.gguf", n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                  vocab=1024)
    budget = 1_500_000  # above the smallest plan (staging, arena, a 256-token KV cache), below the weights' bytes
    row = bench.streaming_row(path, "tiny", 10.0, True, budget)
    assert row["model"] == "tiny" and row["budget_bytes"] == budget
    assert row["resident_tok_s"] > 0 and row["streamed_tok_s"] > 0 and row["streamed_bytes"] > 0
    assert row["x_h2d"] == pytest.approx(row["effective_h2d_gb_s"] / 10.0)


def test_the_graphs_row_on_the_host_model_of_a_cuda_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """graphs_row (make bench-gpu's CUDA graphs figure) on a small synthetic llama, cuda on the host model: both
    decode rates from the same run, every timed step of the graph run a replay, the same greedy tokens."""
    pytest.importorskip("gguf")
    synth = load_script("bench/synth_gguf.py", "synth_gguf_for_bench_gpu")
    from uaii.backends import registry
    from uaii.backends.cuda.backend import CudaBackend
    from uaii.backends.cuda.host import HostDevice

    dev = HostDevice()
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=dev))
    path = synth.write_llama_gguf(tmp_path / "tiny.gguf", n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                  vocab=1024)
    row = bench.graphs_row(path, "tiny", True)
    assert row["model"] == "tiny" and row["steps"] == 16 and row["same_tokens"] is True
    assert row["graph_launches"] == 17 == dev.graph_launches  # the capture's run, then every timed step
    assert row["launch_tok_s"] > 0 and row["x_launches"] == pytest.approx(row["graph_tok_s"] / row["launch_tok_s"])


def test_the_cuda_host_bench_times_both_ways(smollm2_path: Path) -> None:
    """bench_cuda_host.py (`make bench-cuda-host`): SmolLM2 on a stubbed device — a replayed step makes no launch
    call, a launched one a call per kernel; both host times from the same run."""
    host = load_script("bench/bench_cuda_host.py", "bench_cuda_host")
    r = host.host_time(smollm2_path, 3)
    assert r["replayed_launch_calls"] == 0 and r["launched_launch_calls"] > 200
    assert r["replayed_us"] > 0 and r["x_launched"] == pytest.approx(r["launched_us"] / r["replayed_us"])
