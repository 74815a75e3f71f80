"""Test helpers shared by the kernel tests and other packages' tests: random GGUF blocks (random bytes with sane,
finite float16 scale fields) and random weight matrices of any supported type."""

from __future__ import annotations

import numpy as np

from uaii.ir.dtype import DType

# byte offsets of the float16 scale fields inside one block of each type
SCALE_OFFSETS: dict[DType, tuple[int, ...]] = {
    DType.Q4_0: (0,), DType.Q4_1: (0, 2), DType.Q5_0: (0,), DType.Q5_1: (0, 2), DType.Q8_0: (0,),
    DType.Q2_K: (80, 82), DType.Q3_K: (108,), DType.Q4_K: (0, 2), DType.Q5_K: (0, 2), DType.Q6_K: (208,),
    DType.IQ4_NL: (0,), DType.IQ4_XS: (0,), DType.MXFP4: (),
}


def random_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite float16 values: mostly moderate normals, some random finite bit patterns (subnormals included)."""
    vals = (rng.standard_normal(n) * rng.choice([1e-3, 0.05, 1.0, 30.0], n)).astype(np.float16)
    raw = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    raw = raw & np.uint16(0xFBFF)  # exponent never all ones -> finite
    pick = rng.random(n) < 0.2
    return np.where(pick, raw.view(np.float16), vals)


def random_blocks(dt: DType, n_blocks: int, seed: int = 0) -> np.ndarray:
    """n_blocks random blocks of dt as a [n_blocks, type_size] uint8 array."""
    rng = np.random.default_rng(seed)
    if dt is DType.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    if dt is DType.F16:
        return random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if dt is DType.BF16:
        return rng.integers(0, 256, (n_blocks, 2), dtype=np.uint8)
    blocks = rng.integers(0, 256, (n_blocks, dt.type_size), dtype=np.uint8)
    for off in SCALE_OFFSETS[dt]:
        blocks[:, off:off + 2] = random_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_weight(dt: DType, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Packed bytes of a random [n, k] weight of type dt whose values are finite and moderate (for GEMM tests)."""
    rng = np.random.default_rng(seed)
    if dt is DType.F32:
        return (rng.standard_normal((n, k)) * 0.1).astype(np.float32).view(np.uint8).reshape(-1)
    if dt is DType.F16:
        return (rng.standard_normal((n, k)) * 0.1).astype(np.float16).view(np.uint8).reshape(-1)
    if dt is DType.BF16:
        bits = ((rng.standard_normal((n, k)) * 0.1).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(-1)
    nb = n * k // dt.block_size
    blocks = random_blocks(dt, nb, seed)
    for off in SCALE_OFFSETS[dt]:
        blocks[:, off:off + 2] = (np.abs(rng.standard_normal(nb)) * 0.01 + 1e-3).astype(np.float16).view(
            np.uint8).reshape(nb, 2)
    if dt is DType.MXFP4:
        blocks[:, 0] = rng.integers(118, 124, nb)          # 2^-9 .. 2^-3 scales
    return blocks.reshape(-1)
