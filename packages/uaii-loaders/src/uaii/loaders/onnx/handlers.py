"""Imports every handler module once, so that each registers its ops in the dispatch table.

The standard (ai.onnx) modules are listed here; the com.microsoft contrib modules are listed beside them.
"""

from __future__ import annotations

import importlib.util

from . import ops_elementwise, ops_index, ops_linalg, ops_norm, ops_shape

STANDARD = (ops_elementwise, ops_index, ops_linalg, ops_norm, ops_shape)

CONTRIB_MODULES = ("contrib",)
"""com.microsoft handler modules (H3b), imported when present in this source tree."""

for _name in CONTRIB_MODULES:
    if importlib.util.find_spec(f"{__package__}.{_name}") is not None:
        importlib.import_module(f"{__package__}.{_name}")

__all__ = ["CONTRIB_MODULES", "STANDARD"]
