"""scripts/device_models.py: a model carried to a GPU machine in parts, one call each, put together there only whole
and verified."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from repo_scripts import load_script

dm = load_script("scripts/device_models.py", "uaii_scripts_device_models")


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any]:
    """A 1 MB 'model' in place of shared/MODELS.md's (same spec fields), and the scripts/models.py it is known by."""
    data = np.random.default_rng(0).integers(0, 256, 1_000_003, dtype=np.uint8).tobytes()
    path = tmp_path / "src" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(data)
    spec = SimpleNamespace(filename="tiny.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest())
    fake = SimpleNamespace(MODELS={"tiny": spec}, ensure_model=lambda key: path,
                           cache_dir=lambda: tmp_path / "cache")
    monkeypatch.setattr(dm, "_models", lambda: fake)
    return path, fake


def calls(parts: list[Path], tmp: Path, order: list[int]) -> list[Path]:
    """The device's view of one call per part (in ``order``): its carry folder holding that part — and the part
    of the call before, as an ignored file a warm machine keeps."""
    dirs = []
    for k, i in enumerate(order):
        d = tmp / f"call{k}"
        d.mkdir()
        for j in {i, order[k - 1]} if k else {i}:
            shutil.copyfile(parts[j], d / parts[j].name)
        dirs.append(d)
    return dirs


def test_parts_carried_in_any_order_make_the_model_once_all_are_there(tiny: tuple[Path, Any],
                                                                        tmp_path: Path) -> None:
    path, fake = tiny
    parts = dm.split(["tiny"], tmp_path / "carry", part_bytes=300_000)
    assert [p.name for p in parts] == [f"tiny.gguf.part{i:02d}of04" for i in range(1, 5)]
    stage, cache = tmp_path / "stage", fake.cache_dir()
    said = [dm.receive(d, stage, cache) for d in calls(parts, tmp_path, [2, 0, 3, 1])]
    assert said[0] == ["tiny.gguf: 1 of 4 parts staged; still to carry: part01of04, part02of04, part04of04"]
    assert said[2] == ["tiny.gguf: 3 of 4 parts staged; still to carry: part02of04"]
    assert said[3] == [f"tiny.gguf: put together from 4 parts, sha256 verified: {cache / 'tiny.gguf'}"]
    assert (cache / "tiny.gguf").read_bytes() == path.read_bytes()
    assert not list(stage.iterdir()) and [p.name for p in cache.iterdir()] == ["tiny.gguf"]
    # a later call still holding the last part: the model stays as it is
    assert dm.receive(tmp_path / "call3", stage, cache) == ["tiny.gguf: in the model cache"]
    assert not list(stage.iterdir())
    # splitting again rewrites nothing (same bytes)
    mtimes = [p.stat().st_mtime_ns for p in parts]
    assert dm.split(["tiny"], tmp_path / "carry", part_bytes=300_000) == parts
    assert [p.stat().st_mtime_ns for p in parts] == mtimes


def test_a_damaged_part_leaves_no_model_and_says_so(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    _, fake = tiny
    parts = dm.split(["tiny"], tmp_path / "carry", part_bytes=600_000)
    raw = bytearray(parts[1].read_bytes())
    raw[1234] ^= 0x40
    parts[1].write_bytes(bytes(raw))
    stage, cache = tmp_path / "stage", fake.cache_dir()
    dirs = calls(parts, tmp_path, [0, 1])
    dm.receive(dirs[0], stage, cache)
    with pytest.raises(SystemExit, match=r"tiny.gguf: the 2 parts make 1000003 bytes with sha256 [0-9a-f]{64}, "
                                         r"expected 1000003 bytes, [0-9a-f]{64}: a part is damaged"):
        dm.receive(dirs[1], stage, cache)
    assert not (cache / "tiny.gguf").exists() and not list(cache.iterdir()) and not list(stage.iterdir())


def test_a_file_that_is_no_models_part_is_refused(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    carry.mkdir()
    (carry / "other.gguf.part01of02").write_bytes(b"x")
    with pytest.raises(SystemExit, match=r"other\.gguf\.part01of02: not a part of a known model"):
        dm.receive(carry, tmp_path / "stage", tmp_path / "cache")


def test_parts_of_two_different_splits_are_refused(tiny: tuple[Path, Any], tmp_path: Path) -> None:
    _, fake = tiny
    a = dm.split(["tiny"], tmp_path / "a", part_bytes=600_000)
    b = dm.split(["tiny"], tmp_path / "b", part_bytes=300_000)
    stage, carry = tmp_path / "stage", tmp_path / "carry"
    stage.mkdir()
    carry.mkdir()
    shutil.copyfile(a[0], stage / a[0].name)  # staged by an earlier call, from a split in 2
    shutil.copyfile(b[1], carry / b[1].name)  # carried now, from a split in 4
    with pytest.raises(SystemExit, match=r"parts of different splits staged \(\[2, 4\]\)"):
        dm.receive(carry, stage, fake.cache_dir())
    assert not fake.cache_dir().exists()


def test_the_models_are_the_ones_the_tests_fetch() -> None:
    """Unpatched: the parts are named after scripts/models.py's files, and put together where its cache is."""
    models = dm._models()
    assert {"smollm2", "gemma3"} <= set(models.MODELS) and models is load_script("scripts/models.py",
                                                                                "uaii_scripts_models")
    assert all(spec.size > 1 << 20 and len(spec.sha256) == 64 for spec in models.MODELS.values())


def test_receive_all_fails_until_every_model_is_there(tiny: tuple[Path, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """What the device script runs before the model tests: exit 1 (naming what is missing) while a part is still to
    carry, 0 once the model is whole."""
    del tiny  # (the fake models are in place)
    parts = dm.split(["tiny"], tmp_path / "parts", part_bytes=600_000)
    monkeypatch.setattr(dm, "ROOT", tmp_path)
    monkeypatch.setenv("UAII_DEVICE_STAGE", str(tmp_path / "stage"))
    carry = tmp_path / dm.CARRY_DIR
    carry.mkdir()
    shutil.copyfile(parts[0], carry / parts[0].name)
    assert dm.main(["receive", "--all"]) == 1
    assert "not in the model cache yet: tiny.gguf" in capsys.readouterr().err
    (carry / parts[0].name).unlink()
    shutil.copyfile(parts[1], carry / parts[1].name)
    assert dm.main(["receive", "--all"]) == 0
    assert "put together from 2 parts" in capsys.readouterr().out
