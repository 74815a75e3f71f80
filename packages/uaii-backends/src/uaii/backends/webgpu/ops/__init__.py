"""Lowerings of the WebGPU backend, op name → ``lower(ctx, info)`` (see lower.py), gathered from the op families."""

from __future__ import annotations

from uaii.backends.webgpu.lower import Lowering
from uaii.backends.webgpu.ops.attention import LOWERINGS as ATTENTION
from uaii.backends.webgpu.ops.dequant import LOWERINGS as DEQUANT
from uaii.backends.webgpu.ops.elementwise import LOWERINGS as ELEMENTWISE
from uaii.backends.webgpu.ops.gather import LOWERINGS as GATHER
from uaii.backends.webgpu.ops.glu import LOWERINGS as GLU
from uaii.backends.webgpu.ops.linalg import LOWERINGS as LINALG
from uaii.backends.webgpu.ops.moe import LOWERINGS as MOE
from uaii.backends.webgpu.ops.movement import LOWERINGS as MOVEMENT
from uaii.backends.webgpu.ops.norm import LOWERINGS as NORM
from uaii.backends.webgpu.ops.reduce import LOWERINGS as REDUCE
from uaii.backends.webgpu.ops.rope import LOWERINGS as ROPE
from uaii.backends.webgpu.ops.softmax import LOWERINGS as SOFTMAX

LOWERINGS: dict[str, Lowering] = {
    **ATTENTION, **DEQUANT, **ELEMENTWISE, **GATHER, **GLU, **MOVEMENT, **NORM, **REDUCE, **LINALG, **MOE, **ROPE,
    **SOFTMAX}

__all__ = ["LOWERINGS"]
