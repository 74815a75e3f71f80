"""The C tests of native/tests, built against libuaii and run; the example; a valgrind run (slow)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from repo_scripts import load_script

from uaii.capi import paths

RunC = Callable[..., subprocess.CompletedProcess[str]]
EnvFn = Callable[..., dict[str, str]]
NATIVE = Path(__file__).resolve().parents[2] / "native"

C_TESTS = ["test_v030_surface", "test_abi", "test_errors", "test_toy_graphs", "test_threads"]
MODEL_TESTS = ["test_generate", "test_ir_generate"]
PROMPT = "The capital of France is"


def test_every_c_test_is_run() -> None:
    on_disk = sorted(p.stem for p in (NATIVE / "tests").glob("test_*.c"))
    assert on_disk == sorted(C_TESTS + MODEL_TESTS)


@pytest.mark.parametrize("name", C_TESTS)
def test_c_program(name: str, c_build: Path, tmp_path: Path, run_c: RunC) -> None:
    proc = run_c([c_build / "tests" / name, tmp_path])
    assert re.search(rf"^{name}: \d+ checks passed$", proc.stdout, re.M), proc.stdout


def test_v030_surface_compiles_as_strict_c99(tmp_path: Path) -> None:
    """The 0.3.0-only program builds with exactly `-std=c99 -Wall -Werror` and the flags of `python -m uaii.capi`."""
    flags = subprocess.run([sys.executable, "-m", "uaii.capi", "--cflags", "--libs"], capture_output=True,
                           text=True, check=True).stdout.split()
    out = tmp_path / "v030"
    proc = subprocess.run(["cc", "-std=c99", "-Wall", "-Werror", "-pedantic", str(NATIVE / "tests" /
                           "test_v030_surface.c"), "-o", str(out), *flags], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()


@pytest.fixture(scope="module")
def greedy_reference(smollm2_path: Path) -> dict[str, str]:
    """What uaii.runtime.Session says for the prompt: its tokens, 16 greedy tokens, and a chat prompt's tokens."""
    from uaii.runtime import Session

    with Session(smollm2_path) as s:
        ids = s.tokenize(PROMPT)
        result = s.generate(ids, max_new_tokens=16)
        chat = s.tokenizer.encode_chat([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
    assert len(result.tokens) == 16, "the reference generation must not stop early"
    return {"UAII_TEST_MODEL": str(smollm2_path), "UAII_TEST_PROMPT": PROMPT,
            "UAII_TEST_PROMPT_TOKENS": " ".join(map(str, ids)),
            "UAII_TEST_EXPECT": " ".join(map(str, ids + result.tokens)),
            "UAII_TEST_CHAT_TOKENS": " ".join(map(str, chat))}


def test_generation_matches_python_session(c_build: Path, tmp_path: Path, run_c: RunC, c_env: EnvFn,
                                           greedy_reference: dict[str, str]) -> None:
    proc = run_c([c_build / "tests" / "test_generate", tmp_path], env=c_env(**greedy_reference))
    assert "test_generate:" in proc.stdout and "checks passed" in proc.stdout


@pytest.fixture(scope="module")
def relocated_ir_lm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny llama (synthetic GGUF, converted to .uaii) laid out as test_ir_generate.c expects, and the prompt +
    greedy tokens uaii.runtime.Session gives on the original (weights beside the graph)."""
    pytest.importorskip("gguf")
    from uaii.capi.convert import convert_model
    from uaii.ir import WeightRef, load, save
    from uaii.runtime import Session

    synth = load_script("bench/synth_gguf.py", "synth_gguf")
    root = tmp_path_factory.mktemp("ir-lm")
    orig, model, weights = root / "orig", root / "model", root / "weights"
    for d in (orig, model, weights):
        d.mkdir()
    shape = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab=768, qtype="q8_0", context=256)
    synth.write_llama_gguf(orig / "llama.gguf", seed=3, **shape)
    synth.write_llama_gguf(weights / "llama.gguf", seed=3, **shape)
    synth.write_llama_gguf(model / "llama.gguf", seed=4, **shape)  # the decoy beside the graph
    convert_model(str(orig / "llama.gguf"), str(orig / "llama.uaii"))
    shutil.copy(orig / "llama.uaii", model / "llama.uaii")
    graph = load(orig / "llama.uaii")
    norms = [t for t in graph.tensors if t.weight is not None and t.name.endswith("norm.weight")]
    assert len(norms) == 5 and all(t.dtype.value == "f32" for t in norms)
    tensors = tuple(dataclasses.replace(t, weight=WeightRef(f"norms/{t.name}.bin")) if t in norms else t
                    for t in graph.tensors)
    save(dataclasses.replace(graph, tensors=tensors), model / "nonorms.uaii")
    prompt = [1, 17, 300, 42, 5]
    with Session(orig / "llama.uaii") as s:
        new = s.generate(prompt, max_new_tokens=12).tokens
    assert len(new) == 12, "the reference generation must not stop early"
    return {"UAII_TEST_IR_DIR": str(root), "UAII_TEST_PROMPT_TOKENS": " ".join(map(str, prompt)),
            "UAII_TEST_EXPECT": " ".join(map(str, prompt + new))}


def test_ir_model_with_relocated_or_filled_weights_generates(c_build: Path, tmp_path: Path, run_c: RunC,
                                                              c_env: EnvFn,
                                                              relocated_ir_lm: dict[str, str]) -> None:
    """Regression: generation on a .uaii LM whose weights the options relocate (weights_dir, weights_sandbox) or
    fill was UAII_ERR_NOT_IMPLEMENTED; it must give the Session's tokens on the original model."""
    proc = run_c([c_build / "tests" / "test_ir_generate", tmp_path], env=c_env(**relocated_ir_lm))
    assert re.search(r"^test_ir_generate: \d+ checks passed$", proc.stdout, re.M), proc.stdout


def test_example_streams_an_answer(c_build: Path, run_c: RunC, smollm2_path: Path) -> None:
    proc = run_c([c_build / "examples" / "generate", smollm2_path, "Say hello.", "-n", "12"])
    assert proc.stdout.strip(), "the answer is streamed to stdout"
    assert re.search(r"decode [0-9.]+ tok/s", proc.stderr), proc.stderr
    assert "12 generated" in proc.stderr or "(eos)" in proc.stderr


def test_pkg_config_file(c_build: Path) -> None:
    text = (c_build / "uaii.pc").read_text()
    assert f"includedir={paths.get_include()}" in text
    assert f"libdir={paths.get_library_dir()}" in text
    assert "Version: 0.3.0" in text and "-luaii" in text and "@" not in text


@pytest.mark.slow
def test_valgrind_is_clean(c_build: Path, tmp_path: Path, run_c: RunC, c_env: EnvFn) -> None:
    """No memory error and no definite/indirect leak outside the interpreter (native/valgrind/python.supp)."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    log = tmp_path / "valgrind.log"
    run_c([c_build / "tests" / "test_toy_graphs", tmp_path], env=c_env(PYTHONMALLOC="malloc"), timeout=900,
          prefix=["valgrind", f"--suppressions={NATIVE / 'valgrind' / 'python.supp'}", "--leak-check=full",
                  "--show-leak-kinds=definite,indirect", "--errors-for-leak-kinds=definite,indirect",
                  "--error-exitcode=99", f"--log-file={log}"])
    report = log.read_text()
    assert "ERROR SUMMARY: 0 errors" in report, report[-5000:]
    assert re.search(r"definitely lost: 0 bytes", report) or "no leaks are possible" in report, report[-5000:]
