"""H4's ONNX fixtures (scripts/onnx_fixtures.py) through the whole stack: load_model, then the CPU backend.

Every model fixture and every hand-built ``ops-*`` graph must give onnxruntime's outputs (stored in the fixture)
within the fixture's tolerance; the causal ones (no KV I/O) must also continue their prompt greedily with
onnxruntime's tokens when the whole sequence is run again each step (Session.run). The KV-cache fixtures
("causal-kv") are decoded incrementally by H3b's tests (tests/loaders/test_onnx_generate.py,
tests/runtime/test_onnx_decode.py); the MatMulNBits ones by theirs. This file lives in tests/runtime because
uaii-loaders' tests may not import the runtime.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx_fixture_support import assert_outputs_close, fixture, fixture_names

from uaii.loaders import load_model
from uaii.runtime import Session

pytestmark = pytest.mark.slow  # the first use generates the fixtures with torch (minutes, once per version)

ARCHS = ("llama", "qwen2", "gemma3", "gpt2", "bert", "mixtral")
MODELS = [f"{a}-{e}" for a in ARCHS for e in ("dynamo", "legacy")] + ["external-unaligned"]
CAUSAL = [m for m in MODELS if not m.startswith("bert") and m != "external-unaligned"]


def _ops_names() -> list[str]:
    return [n for n in fixture_names() if n.startswith("ops-") and "matmulnbits" not in n]


@pytest.fixture(autouse=True)
def _quiet(caplog: Any) -> None:
    caplog.set_level(logging.ERROR, "uaii.runtime")


@pytest.mark.parametrize("name", MODELS + _ops_names())
def test_fixture_matches_onnxruntime_on_the_cpu_backend(name: str) -> None:
    fx = fixture(name)
    model = load_model(fx.model)
    assert model.format == "onnx" and model.config.architecture == "onnx"
    assert not [t for t in model.graph.weights if t.data is not None]  # weights stay references
    with Session(fx.model) as s:
        got = s.run(fx.inputs())
    assert_outputs_close(fx, got)


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_fixture_greedy_matches_onnxruntime(name: str) -> None:
    """Full forward each step (the model has no KV I/O): the argmax of the last position's logits."""
    fx = fixture(name)
    assert fx.kind == "causal" and fx.greedy is not None
    greedy = fx.greedy
    names = set(fx.inputs())
    ids = list(greedy["prompt_ids"])
    margins = greedy.get("margins") or [1.0] * len(greedy["tokens"])
    with Session(fx.model) as s:
        for step, want in enumerate(greedy["tokens"]):
            seq = np.asarray([ids], np.int64)
            feeds = {"input_ids": seq}
            if "attention_mask" in names:
                feeds["attention_mask"] = np.ones_like(seq)
            if "position_ids" in names:
                feeds["position_ids"] = np.arange(seq.shape[1], dtype=np.int64)[None]
            top = int(np.argmax(np.asarray(s.run(feeds)["logits"])[0, -1]))
            if top != want and float(margins[step]) < 1e-4:
                pytest.skip(f"step {step}: a near-tie (margin {margins[step]:.2e}) in onnxruntime's logits")
            assert top == want, f"{name} step {step}: token {top}, onnxruntime {want}"
            ids.append(top)
