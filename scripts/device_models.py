"""Carry the real models (SmolLM2, Gemma-3) to a lent GPU machine in parts, and put them together there.

Why: issue #18 asks for SmolLM2's and Gemma-3's greedy tokens on cuda against the CPU backend, on the lent machine —
which reaches no registry (scripts/models.py cannot fetch there) and takes at most 64 MiB a call, working tree
included, where the two files are 98 and 253 MB. A machine stays warm between calls (30 s idle), and what a call
writes outside the copied tree stays with it; so the files go over in parts, one call each:

    here:    python3 scripts/device_models.py split           # .device-models/<file>.partNNofMM, and the calls
    device:  python3 scripts/device_models.py receive         # one call per part, carrying that part
    device:  MODELS=1 bash scripts/cuda_device_check.sh       # then the model tests and figures

``receive`` keeps each carried part in a staging folder (``$UAII_DEVICE_STAGE``, default /tmp/uaii-device-stage);
once a model's parts are all there it puts the file together in the model cache (scripts/models.py's, so the
tests' fixtures find it) under a temporary name, checks its size and sha256 against shared/MODELS.md's, and only
then gives it its name: a missing or corrupted part leaves no model behind, and says which.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CARRY_DIR = ".device-models"
PART_BYTES = 48 << 20  # a call carries 64 MiB with the working tree (7 MB today) and nothing else
PART = re.compile(r"^(?P<file>.+)\.part(?P<i>\d{2})of(?P<n>\d{2})$")


def _models() -> Any:
    """scripts/models.py (what the tests' fixtures fetch and find models with)."""
    name = "uaii_scripts_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "models.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # before it runs: its dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[name]


def stage_dir() -> Path:
    return Path(os.environ.get("UAII_DEVICE_STAGE", os.path.join(tempfile.gettempdir(), "uaii-device-stage")))


def split(keys: list[str], out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """The parts of each model of ``keys`` (fetched into the cache first) in ``out``: ``<file>.partNNofMM``."""
    models = _models()
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for key in keys:
        path = models.ensure_model(key)
        size = path.stat().st_size
        n = -(-size // part_bytes)
        if n > 99:
            raise SystemExit(f"[device-models] {path.name}: {n} parts of {part_bytes} bytes (at most 99)")
        with open(path, "rb") as f:
            for i in range(1, n + 1):
                part = out / f"{path.name}.part{i:02d}of{n:02d}"
                data = f.read(part_bytes)
                if not (part.is_file() and part.stat().st_size == len(data) and part.read_bytes() == data):
                    part.write_bytes(data)
                parts.append(part)
    return parts


def receive(src: Path, stage: Path, cache: Path) -> list[str]:
    """Stage the parts present in ``src``; put together every model whose parts are all staged. Lines saying
    what happened, one per model concerned."""
    specs = {spec.filename: spec for spec in _models().MODELS.values()}
    stage.mkdir(parents=True, exist_ok=True)
    for part in sorted(src.glob("*.part*of*")) if src.is_dir() else []:
        m = PART.match(part.name)
        if m is None or m.group("file") not in specs:
            raise SystemExit(f"[device-models] {part}: not a part of a known model ({', '.join(specs)})")
        if complete(cache, specs[m.group("file")]):
            continue  # left over from the call that completed it
        tmp = stage / f".{part.name}.tmp"
        shutil.copyfile(part, tmp)
        os.replace(tmp, stage / part.name)
    lines = []
    for filename, spec in specs.items():
        staged = sorted(p for p in stage.glob(f"{filename}.part*of*") if PART.match(p.name))
        final = cache / filename
        if not staged:
            if complete(cache, spec):
                lines.append(f"{filename}: in the model cache")
            continue
        counts = {int(PART.match(p.name).group("n")) for p in staged}  # type: ignore[union-attr]
        if len(counts) != 1:
            raise SystemExit(f"[device-models] {filename}: parts of different splits staged ({sorted(counts)}); "
                             f"clear {stage}")
        n = counts.pop()
        have = {int(PART.match(p.name).group("i")) for p in staged}  # type: ignore[union-attr]
        missing = sorted(set(range(1, n + 1)) - have)
        if missing:
            lines.append(f"{filename}: {len(have)} of {n} parts staged; still to carry: "
                         + ", ".join(f"part{i:02d}of{n:02d}" for i in missing))
            continue
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{filename}.", dir=cache)
        tmp_path = Path(tmp_name)
        h = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                for i in range(1, n + 1):
                    data = (stage / f"{filename}.part{i:02d}of{n:02d}").read_bytes()
                    h.update(data)
                    out.write(data)
            size = tmp_path.stat().st_size
            if size != spec.size or h.hexdigest() != spec.sha256:
                raise SystemExit(f"[device-models] {filename}: the {n} parts make {size} bytes with sha256 "
                                 f"{h.hexdigest()}, expected {spec.size} bytes, {spec.sha256}: a part is damaged "
                                 f"(staged parts removed; carry them again)")
            tmp_path.chmod(0o644)  # (mkstemp's file is the owner's alone)
            os.replace(tmp_path, final)
        except BaseException:
            tmp_path.unlink(missing_ok=True)
            for p in staged:
                p.unlink(missing_ok=True)
            raise
        for p in staged:
            p.unlink()
        lines.append(f"{filename}: put together from {n} parts, sha256 verified: {final}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("split", help="here: write the parts into .device-models and list the calls")
    sp.add_argument("models", nargs="*", default=["smollm2", "gemma3"])
    sp.add_argument("--part-mib", type=int, default=PART_BYTES >> 20)
    rp = sub.add_parser("receive", help="on the device: stage the carried parts, put together complete models")
    rp.add_argument("--all", action="store_true", help="fail unless every model is then in the model cache (the "
                    "tests would otherwise try to fetch one, from a machine that reaches no registry)")
    args = ap.parse_args(argv)
    if args.cmd == "split":
        parts = split(args.models, ROOT / CARRY_DIR, args.part_mib << 20)
        print(f"{len(parts)} device calls, one per part (each within a warm machine's 30 s of the last), then "
              "MODELS=1 bash scripts/cuda_device_check.sh:")
        for p in parts:
            print(f'  carry ["{CARRY_DIR}/{p.name}"]  command "python3 scripts/device_models.py receive"')
        return 0
    models = _models()
    for line in receive(ROOT / CARRY_DIR, stage_dir(), models.cache_dir()):
        print(line)
    missing = [spec.filename for spec in models.MODELS.values() if not complete(models.cache_dir(), spec)]
    if args.all and missing:
        print(f"[device-models] not in the model cache yet: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def complete(cache: Path, spec: Any) -> bool:
    """Whether ``spec``'s model is in ``cache`` (put together and verified: nothing else gives it its name)."""
    path = cache / spec.filename
    return path.is_file() and path.stat().st_size == spec.size


if __name__ == "__main__":
    sys.exit(main())
