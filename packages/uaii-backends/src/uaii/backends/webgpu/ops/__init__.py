"""Lowerings of the WebGPU backend, op name → ``lower(ctx, info)`` (see lower.py), gathered from the op families."""

from __future__ import annotations

from uaii.backends.webgpu.lower import Lowering
from uaii.backends.webgpu.ops.elementwise import LOWERINGS as ELEMENTWISE

LOWERINGS: dict[str, Lowering] = {**ELEMENTWISE}

__all__ = ["LOWERINGS"]
