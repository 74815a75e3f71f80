"""The ONNX fixtures of ``scripts/onnx_fixtures.py`` for the tests (issue #14): import by name.

    from onnx_fixture_support import fixture, fixtures, onnx_fixtures_dir, assert_outputs_close

The first call of a process generates the whole set into ``$UAII_CACHE_DIR/onnx-fixtures/<key>`` unless it is there
already (a few minutes on two cores, once per generator version and reference versions); later calls and later
sessions reuse it. The directory is resolved once per process, so a test that points ``UAII_CACHE_DIR`` at a
temporary directory afterwards does not regenerate it. Without the references (onnx, onnxruntime, torch,
transformers: the ``test-loaders`` environment has them) the tests that ask for a fixture are skipped.

Outputs compare as the manifest defines: ``|actual - expected| <= tolerance * (1 + |expected|)`` elementwise.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from repo_scripts import load_script

REFERENCES = ("onnx", "onnxruntime", "torch", "transformers")


def generator() -> ModuleType:
    """scripts/onnx_fixtures.py as a module."""
    return load_script("scripts/onnx_fixtures.py", "uaii_scripts_onnx_fixtures")


def _require_references() -> None:
    missing = [m for m in REFERENCES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the ONNX fixtures need {', '.join(missing)} (the test-loaders environment has them)")


@functools.cache
def onnx_fixtures_dir() -> Path:
    """The fixture directory (with manifest.json), generated on first use."""
    _require_references()
    return Path(generator().generate())


def manifest() -> list[dict[str, Any]]:
    """The manifest's entries (see the generator's docstring for every field)."""
    return list(_manifest())


@functools.cache
def _manifest() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((onnx_fixtures_dir() / "manifest.json").read_text())["fixtures"])


@dataclass(frozen=True)
class OnnxFixture:
    """One manifest entry with absolute paths."""

    name: str
    model: Path  # the .onnx file
    kind: str  # forward | causal | causal-kv
    tolerance: float
    entry: dict[str, Any]  # the whole manifest entry

    @property
    def directory(self) -> Path:
        return self.model.parent

    @property
    def greedy(self) -> dict[str, Any] | None:
        return self.entry.get("greedy")

    @property
    def kv(self) -> dict[str, Any] | None:
        return self.entry.get("kv")

    def inputs(self) -> dict[str, np.ndarray]:
        return _npz(onnx_fixtures_dir() / self.entry["inputs"])

    def outputs(self) -> dict[str, np.ndarray]:
        return _npz(onnx_fixtures_dir() / self.entry["outputs"])


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def fixture(name: str) -> OnnxFixture:
    """The fixture ``name`` (a KeyError lists the names when there is none)."""
    for e in _manifest():
        if e["name"] == name:
            return OnnxFixture(e["name"], onnx_fixtures_dir() / e["file"], e["kind"], float(e["tolerance"]), e)
    raise KeyError(f"no ONNX fixture {name!r}; there are {[e['name'] for e in _manifest()]}")


def fixtures(kind: str | None = None, prefix: str = "") -> list[OnnxFixture]:
    """Every fixture, or those of ``kind`` whose name starts with ``prefix``."""
    return [fixture(e["name"]) for e in _manifest()
            if (kind is None or e["kind"] == kind) and e["name"].startswith(prefix)]


def fixture_names() -> list[str]:
    """The names the generator makes, without generating anything (for parametrize)."""
    return list(generator().fixture_names())


def assert_outputs_close(fx: OnnxFixture, actual: dict[str, np.ndarray], expected: dict[str, np.ndarray] | None = None,
                         tolerance: float | None = None) -> None:
    """``actual`` against onnxruntime's outputs (every output the fixture has), with the manifest's rule."""
    expected = fx.outputs() if expected is None else expected
    tol = fx.tolerance if tolerance is None else tolerance
    missing = sorted(set(expected) - set(actual))
    assert not missing, f"{fx.name}: outputs {missing} missing (got {sorted(actual)})"
    for key, exp in expected.items():
        got = np.asarray(actual[key])
        assert got.shape == exp.shape, f"{fx.name}: {key} has shape {got.shape}, onnxruntime's {exp.shape}"
        if exp.dtype.kind in "biu":
            np.testing.assert_array_equal(got, exp, err_msg=f"{fx.name}: {key}")
        else:
            np.testing.assert_allclose(got.astype(np.float64), exp, rtol=tol, atol=tol, equal_nan=True,
                                       err_msg=f"{fx.name}: {key} (tolerance {tol})")
