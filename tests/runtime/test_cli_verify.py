"""`uaii verify MODEL [--sha256 HEX]`: digests of every file of a model, compared with --sha256 or the known
models' pins, and the GGUF structure checks (GGUF itself carries no checksum)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest
from repo_scripts import load_script

from uaii.runtime.cli import main
from uaii.runtime.cli.verify import CHUNK_BYTES, KNOWN_MODELS, sha256_file

pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("UAII_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("UAII_DEBUG", raising=False)


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"w{i}": rng.standard_normal((4, 32), dtype=np.float32) for i in range(6)}


def tiny(path: Path, **kw: object) -> list[Path]:
    return H.write_gguf(path, "llama", {"general.name": "tiny"}, tensors(), **kw)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main(["verify", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_prints_digest_size_and_structure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    code, out, err = run(capsys, path)
    assert code == 0, err
    assert f"{digest(path)}  {path.stat().st_size} bytes  m.gguf  no reference digest" in out
    assert "structure: ok" in out
    assert err.startswith("hashed ") and "/s)" in err  # throughput on stderr


def test_sha256_match_and_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    code, out, _ = run(capsys, path, "--sha256", digest(path).upper())
    assert code == 0 and "matches --sha256" in out
    wrong = "0" * 64
    code, out, err = run(capsys, path, "--sha256", wrong)
    assert code == 1 and "MISMATCH (--sha256)" in out
    assert f"error: [verify] m.gguf: sha256 {digest(path)} does not match {wrong} (--sha256)" in err
    code, _, err = run(capsys, path, "--sha256", "abc")
    assert code == 1 and "--sha256 expects 64 hex digits, found 'abc'" in err


def test_a_known_model_name_is_checked_against_its_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, (model, _, pin) = next(iter(KNOWN_MODELS.items()))
    path = tiny(tmp_path / name)[0]  # the right name, other bytes: a damaged download
    code, out, err = run(capsys, path)
    assert code == 1 and f"MISMATCH ({model})" in out and f"does not match {pin}" in err


def test_the_real_smollm2_matches_its_pin(smollm2_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, smollm2_path, "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["structure"] == {"checked": True, "ok": True, "detail": obj["structure"]["detail"]}
    (f,) = obj["files"]
    assert f["match"] is True and f["expected_from"] == "SmolLM2-135M-Instruct Q4_1"


def test_pins_agree_with_scripts_models() -> None:
    models = load_script("scripts/models.py", "uaii_scripts_models").MODELS
    assert {s.filename: (s.size, s.sha256) for s in models.values()} == {
        name: (size, sha) for name, (_, size, sha) in KNOWN_MODELS.items()}


def test_a_corrupt_table_is_reported_and_the_file_still_hashed(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tiny(tmp_path / "m.gguf")[0]
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<Q", 2) + b"w3") + 10  # w3's record: name, n_dims
    data[at + 4 + 8] ^= 2  # rows 4 -> 6: the tensor now runs into the next one
    path.write_bytes(bytes(data))
    code, out, err = run(capsys, path, "--sha256", digest(path))
    assert code == 1
    assert f"{digest(path)}  {len(data)} bytes  m.gguf  matches --sha256" in out  # the bytes are what we were given
    assert "structure: [gguf] " in out and "overlap" in out
    assert err.count("\n") == 2 and "error: [gguf] " in err and "Traceback" not in err


def test_every_shard_of_a_split_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shards = tiny(tmp_path / "s.gguf", split_max_tensors=2)
    assert len(shards) == 3
    code, out, err = run(capsys, shards[1], "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert [(Path(f["path"]).name, f["sha256"]) for f in obj["files"]] == [(p.name, digest(p)) for p in shards]
    code, _, err = run(capsys, shards[0], "--sha256", digest(shards[0]))
    assert code == 1 and "1 --sha256 values for 3 files" in err
    code, out, _ = run(capsys, shards[0], *[a for p in shards for a in ("--sha256", digest(p))])
    assert code == 0 and out.count("matches --sha256") == 3


def test_other_files_are_only_hashed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x00" * 100)
    code, out, _ = run(capsys, path)
    assert code == 0 and "structure: not a GGUF file: only hashed" in out
    code, _, err = run(capsys, tmp_path)
    assert code == 1 and "expected a model file" in err


def test_sha256_file_streams_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = np.random.default_rng(1).integers(0, 256, CHUNK_BYTES + 5, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    seen: list[int] = []
    assert sha256_file(path, seen.append) == hashlib.sha256(data).hexdigest()
    assert seen == [CHUNK_BYTES, 5]
