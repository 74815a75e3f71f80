"""The ONNX importer's op cases (tests/loaders/test_onnx_import.py, test_onnx_import_semantics.py) on the CPU
backend, and ONNX weights streaming under a memory budget.

Every case of those modules that takes the ``check`` fixture runs here again with a ``check`` that also runs the
model through ``Session.run`` (planner + CPU backend) and compares with onnxruntime (1e-4); every case that takes
``uaii_run`` (UAII's outputs, compared with expectations the case computes itself) gets both the reference's and
the CPU backend's outputs, which must agree exactly.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
import test_onnx_import as cases
import test_onnx_import_semantics as semantics
from onnx import helper

from uaii.loaders import LoadedModel
from uaii.runtime import Session

for _module in (cases, semantics):
    globals().update({name: fn for name, fn in vars(_module).items() if name.startswith("test_") and (
        {"check", "uaii_run"} & set(inspect.signature(fn).parameters))})


@pytest.fixture(autouse=True)
def _quiet_tokenizer(caplog: Any) -> None:
    caplog.set_level(logging.ERROR, "uaii.runtime")  # these graphs have no tokenizer; the runtime says so


def check_cpu(path: Path, feeds: Mapping[str, np.ndarray], tol: float = cases.TOL) -> LoadedModel:
    model = cases.check_reference(path, feeds, tol)
    with Session(path) as s:
        cases.assert_match(s.run(dict(feeds)), cases.ort_run(path, feeds), "cpu", tol)
    return model


@pytest.fixture
def check() -> Any:
    return check_cpu


def run_cpu(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's outputs, once the CPU backend gave the same (bit for bit: these cases are exact)."""
    want = semantics.run_reference(path, feeds)
    with Session(path) as s:
        got = s.run(dict(feeds))
    for name, ref in want.items():
        have = np.asarray(got[name])
        assert have.dtype == ref.dtype and have.shape == ref.shape, (name, have.dtype, have.shape, ref.dtype, ref.shape)
        np.testing.assert_array_equal(have, ref, err_msg=f"cpu {name}")
    return want


@pytest.fixture
def uaii_run() -> Any:
    return run_cpu


def test_one_session_runs_two_lengths(tmp_path: Path) -> None:
    p = cases.make(tmp_path, [helper.make_node("Softmax", ["x"], ["y"])], [("x", cases.F, ["batch", "seq", 4])],
                   [("y", cases.F, None)])
    with Session(p) as s:
        for n in (2, 9):
            x = cases.randn(1, n, 4)
            cases.assert_match(s.run({"x": x}), cases.ort_run(p, {"x": x}), f"length {n}")


@pytest.mark.parametrize("layout", ["n_k_transposed", "k_n"])
def test_onnx_weights_stream_under_a_budget(tmp_path: Path, layout: str) -> None:
    """A budget below the weights' size streams the MatMul weights through the storage layer, with the same
    outputs as onnxruntime. Both layouts exporters write: a stored [N, K] weight behind a Transpose (read by rows,
    transpose_b) and a stored [K, N] one (the dynamo exporter's)."""
    d, layers = 256, 6
    inits = {f"w{i}": cases.randn(d, d) * 0.05 for i in range(layers)}
    nodes = []
    for i in range(layers):
        w = f"w{i}"
        if layout == "n_k_transposed":
            nodes.append(helper.make_node("Transpose", [w], [f"t{i}"], perm=[1, 0]))
            w = f"t{i}"
        nodes += [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", w], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i}"])]
    p = cases.make(tmp_path, nodes, [("x", cases.F, ["n", d])], [(f"h{layers - 1}", cases.F, None)], inits)
    x = cases.randn(4, d)
    expected = cases.ort_run(p, {"x": x})
    weight_bytes = layers * d * d * 4
    with Session(p) as s:
        assert s._exe.streaming is None
        cases.assert_match(s.run({"x": x}), expected, "unbudgeted")
    for _ in range(3):  # fresh sessions: each binds while its first reads are in flight
        with Session(p, budget_bytes=weight_bytes // 2, max_batch=8) as s:
            assert s.streaming
            modes = {w.ref: w.mode for w in s.plan.storage.weights}
            assert set(modes) == {f"model.onnx#w{i}" for i in range(layers)}
            assert "streamed" in modes.values(), modes
            cases.assert_match(s.run({"x": x}), expected, "streamed")
            assert s.storage_stats()["bytes_read"] > 0
