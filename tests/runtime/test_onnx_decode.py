"""A Session decodes an ONNX causal LM with a KV cache, through the CPU backend, token for token as onnxruntime.

The models are the hand-built ones of tests/loaders/onnx_lm_support.py: an onnxruntime-genai-style graph
(GroupQueryAttention with rotary caches; float, and int4 MatMulNBits projections — deterministic weights whose
greedy tokens the CPU kernels reproduce) and an exporter-style graph (MatMul/Softmax attention, causal mask from
positions, with and without a sliding window). The KV mapping (uaii.loaders.onnx.kv) makes them generative; the
Session then prefills and decodes with its KV state. onnxruntime's greedy loop on the same file is the reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.loaders.onnx.kv_verify import DEFAULT_CONTEXT
from uaii.runtime import Session, SessionError

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_lm_support import NEW, PROMPT, causal_fixtures, exported_like, genai_like, ort_greedy  # noqa: E402

MODELS = {"gqa": (lambda: genai_like(), False), "gqa-window": (lambda: genai_like(window=3), False),
          "gqa-int4": (lambda: genai_like(quantized=True), False),
          "exported": (lambda: exported_like(), True), "exported-window": (lambda: exported_like(window=3), True)}


def _model(tmp_path: Path, name: str) -> tuple[Path, bool]:
    build, positions = MODELS[name]
    path = tmp_path / name / "model.onnx"
    path.parent.mkdir()
    onnx.save(build(), path)
    return path, positions


@pytest.mark.parametrize("name", sorted(MODELS))
def test_session_decodes_like_onnxruntime(tmp_path: Path, name: str) -> None:
    path, positions = _model(tmp_path, name)
    want, _ = ort_greedy(path, PROMPT, NEW, 2, positions=positions)
    with Session(path) as s:
        assert s.generative
        got = s.generate(PROMPT, max_new_tokens=NEW, ignore_eos=True).tokens
    assert list(got) == want


def test_session_forward_logits_match_onnxruntime(tmp_path: Path) -> None:
    path, _ = _model(tmp_path, "gqa")
    _, want = ort_greedy(path, PROMPT, 2, 2, positions=False)
    with Session(path) as s:
        first = s.forward(PROMPT)
        second = s.forward([int(np.argmax(first))])
    np.testing.assert_allclose(first, want[0][-1], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(second, want[1][-1], atol=1e-4, rtol=1e-4)


def test_window_and_sinks_change_nothing_while_everything_fits(tmp_path: Path) -> None:
    """kv_window/kv_sinks come from the runtime's KV state, as for GGUF models: with 8 + 2 slots the first 5
    generated tokens (10 tokens in all) see the whole history, so they are onnxruntime's."""
    path, _ = _model(tmp_path, "gqa")
    want, _ = ort_greedy(path, PROMPT, 5, 2, positions=False)
    options: dict[str, Any] = {"kv_window": 8, "kv_sinks": 2}
    with Session(path, **options) as s:
        got = list(s.generate(PROMPT, max_new_tokens=12, ignore_eos=True).tokens)
    assert len(got) == 12 and got[:5] == want


def test_a_session_runs_no_further_than_the_masks_were_checked(tmp_path: Path) -> None:
    """The exported model tells no context, so the KV mapping checked its masks at DEFAULT_CONTEXT tokens (a
    sliding window longer than that would not have shown) and says so: a session's context is no more, even when
    asked for more."""
    path, _ = _model(tmp_path, "exported")
    with Session(path, max_context=4 * DEFAULT_CONTEXT) as s:
        assert s.context == DEFAULT_CONTEXT
        with pytest.raises(SessionError, match="do not fit the context"):
            s.generate([1] * (DEFAULT_CONTEXT + 1), max_new_tokens=1)


@pytest.mark.slow
def test_fixture_greedy_through_the_cpu_backend() -> None:
    """H4's causal-kv fixtures (Optimum exports and onnxruntime-genai int4 builds): token for token."""
    for path, entry in causal_fixtures():
        greedy = entry["greedy"]
        with Session(path) as s:
            got = s.generate(list(greedy["prompt_ids"]), max_new_tokens=len(greedy["tokens"]),
                             ignore_eos=True).tokens
        assert list(got) == list(greedy["tokens"]), entry["name"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_cuda_backend_decodes_like_onnxruntime(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same models on ``device="cuda"`` — on the host model of a device, running the CUDA source of its
    thread-local kernels built by the host compiler — decode onnxruntime's tokens: the imported graphs keep ONNX's
    ops around the decoder (Less and Where, Cast, Concat, Transpose, Cos/Sin rotary tables, MatMulNBits)."""
    from uaii.backends import registry
    from uaii.backends.cuda.backend import CudaBackend
    from uaii.backends.cuda.host import HostDevice

    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=HostDevice(kernels="compiled")))
    path, positions = _model(tmp_path, name)
    want, _ = ort_greedy(path, PROMPT, NEW, 2, positions=positions)
    with Session(path, device="cuda") as s:
        got = s.generate(PROMPT, max_new_tokens=NEW, ignore_eos=True).tokens
    assert list(got) == want
