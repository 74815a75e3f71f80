"""The plumbing of bench/bench_generate.py (`make bench-generate`) and of llama.cpp's benchmark-only environment
(bench/llama_cpp_env.py): medians over alternating runs, a failed run is skipped and all-failed is that row's error,
the explicit-ISA build spells out the CPU's flags and never asks for AMX, and a build is reused only while its pins
and flags hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from repo_scripts import REPO, load_script

sys.path.insert(0, str(REPO / "bench"))
gen = load_script("bench/bench_generate.py", "bench_generate")
env = load_script("bench/llama_cpp_env.py", "llama_cpp_env")


def test_medians_skip_failed_runs_and_an_all_failed_setting_is_its_error() -> None:
    runs = [{"prefill_tok_s": 300.0, "decode_tok_s": 90.0, "peak_rss_bytes": 10, "load_s": 0.5, "version": "x"},
            {"error": "killed"},
            {"prefill_tok_s": 100.0, "decode_tok_s": 110.0, "peak_rss_bytes": 30, "load_s": 0.7, "version": "x"},
            {"prefill_tok_s": 200.0, "decode_tok_s": 70.0, "peak_rss_bytes": 20, "load_s": 0.6, "version": "x"}]
    m = gen.median_of(runs)
    assert (m["prefill_tok_s"], m["decode_tok_s"], m["peak_rss_bytes"], m["runs"]) == (200.0, 90.0, 20.0, 3)
    assert gen.median_of(runs[:1] + runs[2:3])["decode_tok_s"] == 100.0  # an even count: the mean of the middle two
    assert gen.median_of([{"error": "SIGILL"}, {"error": "other"}]) == {"error": "SIGILL"}


def test_the_explicit_build_lists_this_cpus_isa_and_never_amx() -> None:
    args = env.explicit_cmake_args().split()
    assert args[0] == "-DGGML_NATIVE=OFF" and all(a.startswith("-DGGML_") and a.endswith("=ON") for a in args[1:])
    assert not any("AMX" in a for a in args)
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    assert ("-DGGML_AVX2=ON" in args) == (" avx2" in flags)


def test_a_build_is_reused_only_while_its_pins_and_flags_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "VENV", tmp_path)
    monkeypatch.setattr(env, "RECORD", tmp_path / "rec.json")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    built: list[str] = []
    monkeypatch.setattr(env, "build", lambda args, flavor: built.append(flavor))
    monkeypatch.setattr(env, "smoke", lambda model: 0)
    record = {"pins": list(env.PINS), "cmake_args": env.explicit_cmake_args(), "flavor": "explicit ISA"}
    env.RECORD.write_text(json.dumps(record))
    assert env.ensure(Path("m.gguf")) == (tmp_path / "bin" / "python", "explicit ISA") and built == []
    env.RECORD.write_text(json.dumps({**record, "cmake_args": "-DGGML_NATIVE=OFF"}))  # the flags changed
    assert env.ensure(Path("m.gguf"))[1] == "explicit ISA" and built == ["explicit ISA"]  # native crashed before
    env.RECORD.write_text(json.dumps({**record, "pins": ["llama-cpp-python==0.0.1"], "flavor": "native"}))
    built.clear()
    assert env.ensure(Path("m.gguf"))[1] == "native" and built == ["native"]


def test_a_crashing_native_build_falls_back_to_the_explicit_one(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env, "VENV", tmp_path)
    monkeypatch.setattr(env, "RECORD", tmp_path / "rec.json")
    built: list[str] = []
    monkeypatch.setattr(env, "build", lambda args, flavor: built.append(flavor))
    monkeypatch.setattr(env, "smoke", lambda model: -4 if built[-1] == "native" else 0)  # SIGILL, then runs
    assert env.ensure(Path("m.gguf")) == (tmp_path / "bin" / "python", "explicit ISA")
    assert built == ["native", "explicit ISA"]
    monkeypatch.setattr(env, "smoke", lambda model: -11)
    built.clear()
    exe, why = env.ensure(Path("m.gguf"))
    assert exe is None and "no llama.cpp build runs here" in why and built == ["native", "explicit ISA"]
