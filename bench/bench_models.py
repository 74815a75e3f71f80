"""The real models of ``scripts/models.py`` for the benchmark scripts, which run as ``python bench/<script>.py``
(so this folder is on ``sys.path``): one loader of that script, and one table of their GEMV shapes, instead of a
copy in each benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# (name, k, n): W is [n, k]; y = x . W^T — the matrix-vector products of the real models' layers
GEMV_SHAPES = [
    ("smollm2 ffn_up/gate", 576, 1536),
    ("smollm2 ffn_down", 1536, 576),
    ("smollm2 lm_head", 576, 49152),
    ("gemma3 ffn_up/gate", 640, 2048),
    ("gemma3 ffn_down", 2048, 640),
    ("gemma3 lm_head", 640, 262144),
]


def model_path(key: str) -> Path:
    """The cached file of model ``key`` (``smollm2``, ``gemma3``), fetched into the model cache if missing."""
    spec = importlib.util.spec_from_file_location("uaii_scripts_models", REPO / "scripts" / "models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("uaii_scripts_models", mod)  # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return Path(mod.ensure_model(key, quiet=False))
