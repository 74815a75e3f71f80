"""Helpers of the uaii-storage tests (importable as `storage_helpers`): random weight files, indexes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from uaii.ir import DType
from uaii.storage import WeightLocation

MiB = 1 << 20


@dataclass
class WeightFile:
    path: Path
    data: np.ndarray  # the file's bytes
    index: dict[str, WeightLocation]

    def expected(self, loc: WeightLocation) -> bytes:
        return self.data[loc.offset:loc.end].tobytes()


def write_bytes(path: Path, data: np.ndarray) -> None:
    with open(path, "wb") as fh:
        fh.write(data.tobytes())
        fh.flush()
        os.fsync(fh.fileno())


def random_weight_file(path: Path, size: int, n_tensors: int, seed: int, max_tensor: int) -> WeightFile:
    """A file of random bytes and an index of u8/f32/f16/q4_0 tensors at random (often unaligned) offsets."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size, dtype=np.uint8)
    write_bytes(path, data)
    index: dict[str, WeightLocation] = {}
    kinds = [DType.U8, DType.F32, DType.F16, DType.Q4_0]
    for i in range(n_tensors):
        dtype = kinds[i % len(kinds)]
        unit = dtype.type_size
        count = int(rng.integers(1, max(2, max_tensor // unit)))
        nbytes = count * unit
        offset = int(rng.integers(0, size - nbytes + 1))
        shape = (count * dtype.block_size,) if count % 2 else (2, count * dtype.block_size // 2)
        if dtype.is_quantized:
            shape = (count * dtype.block_size,)
        index[f"{path.name}#t{i}"] = WeightLocation(str(path), offset, nbytes, dtype, shape)
    return WeightFile(path, data, index)


def filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (from /proc/self/mounts; the longest mount point wins)."""
    real = os.path.realpath(path)
    best, fstype = "", "unknown"
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) < 3:
                continue
            mnt = fields[1].replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, fields[2]
    return fstype
