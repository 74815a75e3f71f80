from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from uaii.ir import DType, UaiiError
from uaii.storage import StorageError, WeightLocation, as_location, expert_location, locate_raw_file, lookup


def test_location_checks_size_against_dtype_and_shape() -> None:
    WeightLocation("/m.gguf", 0, 2 * 18, DType.Q4_0, (64,))
    with pytest.raises(StorageError, match=r"needs 24 bytes, the location says 25"):
        WeightLocation("/m.gguf", 16, 25, DType.F32, (2, 3))
    with pytest.raises(StorageError, match="multiple of 32"):
        WeightLocation("/m.gguf", 0, 18, DType.Q4_0, (31,))
    with pytest.raises(StorageError, match="negative"):
        WeightLocation("/m.gguf", -1, 4, DType.F32, (1,))


def test_expert_location_slices_the_outermost_dimension() -> None:
    bank = WeightLocation("/m.gguf", 1000, 8 * 4 * 64 // 32 * 18, DType.Q4_0, (8, 4, 64))
    per = bank.nbytes // 8
    e3 = expert_location(bank, 3)
    assert e3 == WeightLocation("/m.gguf", 1000 + 3 * per, per, DType.Q4_0, (4, 64))
    with pytest.raises(StorageError, match="has 8 experts; expert 8 does not exist"):
        expert_location(bank, 8)
    with pytest.raises(StorageError, match="scalar"):
        expert_location(WeightLocation("/m", 0, 4, DType.F32, ()), 0)


def test_lookup_derives_expert_refs_from_the_bank() -> None:
    bank = WeightLocation("/m.gguf", 64, 4 * 6 * 4, DType.F32, (4, 6))
    index = {"m.gguf#blk.0.ffn_up_exps": bank}
    assert lookup(index, "m.gguf#blk.0.ffn_up_exps#e=2") == expert_location(bank, 2)
    explicit = WeightLocation("/other", 0, 24, DType.F32, (6,))
    e2 = "m.gguf#blk.0.ffn_up_exps#e=2"
    assert lookup({**index, e2: explicit}, e2) == explicit
    with pytest.raises(StorageError, match=r"'m.gguf#nope' is not in the location index \(1 entries\)"):
        lookup(index, "m.gguf#nope")
    with pytest.raises(StorageError, match="has 4 experts; expert 9"):
        lookup(index, "m.gguf#blk.0.ffn_up_exps#e=9")


def test_lookup_accepts_loader_records_and_loader_errors() -> None:
    record = SimpleNamespace(file="/m.safetensors", offset=8, nbytes=12, dtype=DType.F32, shape=(3,))

    class LoaderIndex(dict):
        def __getitem__(self, key: str) -> object:
            if key not in self.keys():
                raise UaiiError("[loader] not in the model's index")
            return super().__getitem__(key)

    index = LoaderIndex({"m#w": record})
    assert lookup(index, "m#w") == WeightLocation("/m.safetensors", 8, 12, DType.F32, (3,))
    assert as_location(lookup(index, "m#w")) is not None
    with pytest.raises(StorageError, match="not in the location index"):
        lookup(index, "m#x")


def test_locate_raw_file(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    np.arange(6, dtype="<f4").tofile(tmp_path / "w" / "bias.bin")
    loc = locate_raw_file("w/bias.bin", tmp_path, dtype="f32", shape=(2, 3))
    assert loc == WeightLocation(str(tmp_path / "w" / "bias.bin"), 0, 24, DType.F32, (2, 3))
    with pytest.raises(StorageError, match="holds 24 bytes; a f32 tensor of shape \\[4\\] needs 16"):
        locate_raw_file("w/bias.bin", tmp_path, dtype=DType.F32, shape=(4,))
    with pytest.raises(StorageError, match="cannot stat raw weight file"):
        locate_raw_file("w/missing.bin", tmp_path, dtype=DType.F32, shape=(1,))
    with pytest.raises(StorageError, match="not a raw file"):
        locate_raw_file("w/bias.bin#t", tmp_path, dtype=DType.F32, shape=(6,))
    with pytest.raises(UaiiError, match="escape the sandbox"):
        locate_raw_file("../bias.bin", tmp_path / "w", sandbox=tmp_path / "w", dtype=DType.F32, shape=(6,))


def test_rows_ref_is_a_contiguous_row_range_of_a_block_tensor() -> None:
    from uaii.storage import row_range, rows_ref

    loc = WeightLocation("/m.gguf", 4096, 8 * 34 * 2, DType.Q8_0, (8, 64))  # 8 rows of 2 Q8_0 blocks
    index = {"m.gguf#out.weight": loc}
    got = lookup(index, rows_ref("m.gguf#out.weight", 2, 5))
    assert got == WeightLocation("/m.gguf", 4096 + 2 * 68, 3 * 68, DType.Q8_0, (3, 64))
    assert row_range(loc, 0, 8) == loc
    with pytest.raises(StorageError, match="rows 7:9"):
        lookup(index, rows_ref("m.gguf#out.weight", 7, 9))
