"""The distributions are publishable and honest, and a newcomer's first command works with nothing but Python + pip.

- every package ships the repository's Apache-2.0 LICENSE and declares it (PEP 639), with classifiers that fit it;
- summaries do not announce what does not exist, and every extra installs something the package imports;
- built artifacts carry the LICENSE, native wheels a manylinux tag, pure ones py3-none-any (scripts/dists.py);
- `make demo` uses an environment with what a user installs (no dev tools, no test references);
- with no uv on PATH, `make` installs uv itself, without root and without touching the system Python (PEP 668).
"""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.name for p in (REPO / "packages").glob("uaii-*"))
COMMON_CLASSIFIERS = {
    "Operating System :: POSIX :: Linux",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3.11",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
}
# Announced once in these summaries and READMEs, none of them exists in the code (issue 11, point 10).
NOT_BUILT = re.compile(r"dashboard|device scheduler|\bONNX\b|\bMLX\b|PyTorch|\[torch\]|\[onnx\]|\[mlx\]|\[all\]",
                       re.IGNORECASE)
dists = load_script("scripts/dists.py", "uaii_scripts_dists")
check_deps = load_script("scripts/check_deps.py", "uaii_scripts_check_deps")


def project(package: str) -> dict[str, Any]:
    with open(REPO / "packages" / package / "pyproject.toml", "rb") as f:
        table: dict[str, Any] = tomllib.load(f)["project"]
    return table


def test_license_is_apache_2_and_every_package_ships_the_same_copy() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    # an sdist is built from its package directory alone, so each needs its own copy; a copy may not drift
    drifted = [p for p in PACKAGES if (REPO / "packages" / p / "LICENSE").read_text() != text]
    assert not drifted, f"packages/<name>/LICENSE differs from the repository's LICENSE in {drifted}"


@pytest.mark.parametrize("package", PACKAGES)
def test_metadata_declares_license_and_classifiers(package: str) -> None:
    meta = project(package)
    assert meta["license"] == "Apache-2.0"  # PEP 639 SPDX expression -> License-Expression
    assert meta["license-files"] == ["LICENSE"]
    classifiers = set(meta.get("classifiers", []))
    missing = COMMON_CLASSIFIERS - classifiers
    assert not missing, missing
    assert not any(c.startswith("License ::") for c in classifiers)  # superseded by the expression
    native = (REPO / "packages" / package / "csrc").is_dir()
    assert ("Programming Language :: C" in classifiers) == native
    typed = any((REPO / "packages" / package / "src").glob("uaii/*/py.typed"))
    assert ("Typing :: Typed" in classifiers) == typed
    for label, url in meta.get("urls", {}).items():  # none is declared: the repository has no public address yet
        assert url.startswith("https://") and not re.search(r"example|placeholder|todo", url, re.I), (label, url)


@pytest.mark.parametrize("package", PACKAGES)
def test_summary_and_readme_claim_only_what_exists(package: str) -> None:
    meta = project(package)
    readme = (REPO / "packages" / package / meta["readme"]).read_text()
    for where, text in (("description", meta["description"]), ("README.md", readme)):
        found = NOT_BUILT.findall(text)
        assert not found, f"{package} {where} announces {found}, which the code does not have"


def imported_modules(package: str) -> set[str]:
    """Top-level modules a package's sources import, statically or through ``require("name", ...)``."""
    found: set[str] = set()
    for path in (REPO / "packages" / package / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("require", "import_module")
                  and node.args and isinstance(node.args[0], ast.Constant)):
                found.add(str(node.args[0].value).split(".")[0])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_extra_installs_something_the_package_imports(package: str) -> None:
    """Every requirement of an extra is imported by the package (under its module name: check_deps'
    MODULE_DISTRIBUTIONS), or is a shared library that another requirement of that extra loads (RUNTIME_LIBRARIES:
    the NVRTC wheel, which cuda-bindings finds)."""
    modules = imported_modules(package)
    dist_of = {normalize(d): m for m, d in check_deps.MODULE_DISTRIBUTIONS.items()}
    for extra, requirements in project(package).get("optional-dependencies", {}).items():
        names = [normalize(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]) for req in requirements]
        for name in names:
            assert name != normalize(package), f"{package}[{extra}] only gathers other extras: {name}"
            loader = check_deps.RUNTIME_LIBRARIES.get(name)
            if loader is not None:
                assert normalize(loader) in names, \
                    f"{package}[{extra}] installs {name} without {loader}, which loads it"
                continue
            assert dist_of.get(name, name.replace("-", "_")) in modules, \
                f"{package}[{extra}] installs {name}, which no module of {package} imports"


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _wheel(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    path = tmp / name
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


def test_artifact_checks_catch_a_missing_license_and_a_wrong_tag(tmp_path: Path) -> None:
    meta = b"Metadata-Version: 2.4\nName: x\nVersion: 1\nLicense-Expression: Apache-2.0\nLicense-File: LICENSE\n" \
           b"Classifier: Programming Language :: C\n"
    bad = _wheel(tmp_path, "x-1-cp311-cp311-linux_x86_64.whl", {"x/_c.abi3.so": b"", "x-1.dist-info/METADATA": meta})
    problems = dists.check_wheel(bad)
    assert any("no .dist-info/licenses/LICENSE" in p for p in problems)
    assert any("expected a manylinux tag" in p for p in problems)
    good = _wheel(tmp_path, "x-1-py3-none-any.whl", {"x/a.py": b"", "x-1.dist-info/METADATA": meta,
                                                      "x-1.dist-info/licenses/LICENSE": b"Apache"})
    assert dists.check_wheel(good) == []
    pure_misnamed = good.rename(tmp_path / "x-1-cp311-cp311-manylinux_2_34_x86_64.whl")
    assert any("expected 'py3-none-any'" in p for p in dists.check_wheel(pure_misnamed))
    sdist = tmp_path / "x-1.tar.gz"
    pkg_info = meta.replace(b"License-Expression: Apache-2.0\n", b"")
    with tarfile.open(sdist, "w:gz") as tar:
        info = tarfile.TarInfo("x-1/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
    problems = dists.check_sdist(sdist)
    assert any("no x-1/LICENSE" in p for p in problems) and any("License-Expression None" in p for p in problems)


@pytest.mark.slow
def test_pure_and_native_wheels_and_sdists_are_publishable(tmp_path: Path) -> None:
    """uaii-ir (pure) and uaii-storage (C via cffi) built as `make wheels` builds every package."""
    made = {f.name: f for f in dists.make(["ir", "storage"], tmp_path)}
    names = sorted(made)
    assert [n for n in names if n.endswith(".tar.gz")] == ["uaii_ir-0.1.0.tar.gz", "uaii_storage-0.1.0.tar.gz"]
    assert "uaii_ir-0.1.0-py3-none-any.whl" in names
    native = [n for n in names if n.startswith("uaii_storage-") and n.endswith(".whl")]
    assert len(native) == 1 and re.search(r"-manylinux_2_\d+_x86_64\.whl$", native[0]), names
    license_text = (REPO / "LICENSE").read_bytes()
    for name, path in made.items():
        if name.endswith(".whl"):
            with zipfile.ZipFile(path) as zf:
                member = next(n for n in zf.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
                assert zf.read(member) == license_text, name
                meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        else:
            with tarfile.open(path) as tar:
                root = name.removesuffix(".tar.gz")
                f = tar.extractfile(f"{root}/LICENSE")
                assert f is not None and f.read() == license_text, name
                info = tar.extractfile(f"{root}/PKG-INFO")
                assert info is not None
                meta = info.read().decode()
        assert "License-Expression: Apache-2.0" in meta and "Classifier: Operating System :: POSIX :: Linux" in meta


def _make(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make is not None, "make is a requirement of the README"
    return subprocess.run([make, "--no-print-directory", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # builds the native packages again when their sources changed since the last sync
def test_demo_environment_holds_what_a_user_installs(tmp_path: Path) -> None:
    venv = tmp_path / "demo"
    proc = _make(["demo-env", f"DEMO_VENV={venv}"], REPO, dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    code = ("import importlib.util as u, uaii.runtime, uaii.loaders, gguf; "
            "print(sorted(m for m in ('torch', 'transformers', 'pytest', 'mypy') if u.find_spec(m)))")
    probe = subprocess.run([venv / "bin" / "python", "-c", code], capture_output=True, text=True)
    assert probe.returncode == 0 and probe.stdout.strip() == "[]", probe.stdout + probe.stderr
    cli = subprocess.run([venv / "bin" / "uaii", "--help"], capture_output=True, text=True)
    assert cli.returncode == 0 and "run" in cli.stdout, cli.stderr
    size = sum(f.lstat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    assert size < 400 << 20, f"the demo environment holds {size >> 20} MiB"


def test_make_installs_uv_when_none_is_on_path(tmp_path: Path) -> None:
    """A newcomer's machine: Python, pip and make, no uv. The system Python may refuse `pip install` (PEP 668)."""
    venv_bin = Path(sys.prefix, "bin") if sys.prefix != sys.base_prefix else None  # no pip in a uv venv
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not os.access(os.path.join(d, "uv"), os.X_OK) and Path(d) != venv_bin)
    python3 = shutil.which("python3", path=path)
    assert python3 is not None, f"no python3 on {path}"
    env = {k: v for k, v in os.environ.items() if k not in ("UV", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = path
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    proc = _make(["uv"], tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    uv = tmp_path / ".venv-tools" / "bin" / "uv"
    assert "no uv on PATH: installing uv" in proc.stdout and f"{uv}: uv " in proc.stdout, proc.stdout
    # the targets that run uv now use that one, and the demo syncs what a user installs, not the test references
    dry = _make(["-n", "demo"], tmp_path, env)
    assert dry.returncode == 0, dry.stderr
    sync = next(line for line in dry.stdout.splitlines() if " sync " in line)
    assert f"{uv} sync --package uaii-runtime --package uaii-loaders --extra gguf --no-default-groups" in sync
    assert "reference" not in dry.stdout and "--all-packages" not in dry.stdout
