"""Each package stands on what it declares (issue #12): the import graph matches the pyproject files
(scripts/check_deps.py, run by `make lint`), and `make isolation` runs every package's tests in a venv holding that
package and its declared dependencies only (scripts/check_isolated.py checks the venv holds exactly those)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
deps = load_script("scripts/check_deps.py", "check_deps")  # check_isolated imports it under this name
isolated = load_script("scripts/check_isolated.py", "uaii_scripts_check_isolated")
PACKAGES = sorted(p.name.removeprefix("uaii-") for p in (REPO / "packages").glob("uaii-*"))


def test_the_repository_imports_only_what_it_declares() -> None:
    errors, _ = deps.check(REPO)
    assert errors == []
    assert sorted(deps.LAYERS) == PACKAGES  # every package has its place in the picture of DESIGN §2


# --- the checker catches each kind of problem ------------------------------------------------------------------
def _package(root: Path, name: str, deps_: tuple[str, ...] = (), code: str = "", extra: str = "") -> None:
    pkg = root / "packages" / f"uaii-{name}"
    (pkg / "src" / "uaii" / name).mkdir(parents=True)
    requirements = "".join(f'    "uaii-{d}>=0.1,<0.2",\n' for d in deps_)
    sources = "".join(f"uaii-{d} = {{ workspace = true }}\n" for d in deps_)
    (pkg / "pyproject.toml").write_text(f'[project]\nname = "uaii-{name}"\ndependencies = [\n{requirements}'
                                        f'    "numpy>=1.26,<3",\n]\n{extra}\n[tool.uv.sources]\n{sources}')
    (pkg / "src" / "uaii" / name / "__init__.py").write_text(textwrap.dedent(code))


def _workspace(root: Path, **code: str) -> Path:
    """uaii-ir <- uaii-kernels, uaii-storage <- uaii-backends, uaii-planner <- uaii-ir + uaii-storage; ``code``
    replaces a package's __init__.py."""
    _package(root, "ir", code=code.get("ir", "import numpy\n"))
    _package(root, "kernels", ("ir",), code.get("kernels", "from uaii.ir import x\n"))
    _package(root, "storage", ("ir",), code.get("storage", "import os\nfrom uaii.ir.errors import E\n"))
    _package(root, "backends", ("ir", "kernels", "storage"),
             code.get("backends", "import uaii.ir\nfrom uaii.kernels.native import lib\n"
                                  "from uaii.storage import PAGE\n"))
    _package(root, "planner", ("ir", "storage"), code.get("planner", "import uaii.ir\nfrom uaii import storage\n"))
    return root


def test_a_clean_workspace_passes(tmp_path: Path) -> None:
    assert deps.check(_workspace(tmp_path)) == ([], [])


CASES = {
    "function-level import of an undeclared sibling": (
        {"kernels": "def f():\n    from uaii.storage import PAGE\n"},
        r"kernels/src/uaii/kernels/__init__.py:2: uaii-kernels imports uaii.storage, expected uaii-storage in its "
        r"\[project\].dependencies, found it undeclared"),
    "namespace import of an undeclared sibling": (
        {"storage": "from uaii import kernels\n"}, r"uaii-storage imports uaii.kernels, expected uaii-kernels"),
    "import_module of an undeclared sibling": (
        {"storage": "import importlib\nm = importlib.import_module('uaii.kernels.native')\n"},
        r"uaii-storage imports uaii.kernels, expected uaii-kernels in its"),
    "private module": (
        {"backends": "from uaii.storage._native import PAGE\n"},
        r"backends/__init__.py:1: uaii-backends imports uaii.storage._native, a private module of uaii-storage"),
    "private module imported by name": (
        {"backends": "from uaii.kernels import _native\n"},
        r"uaii-backends imports uaii.kernels._native, a private module of uaii-kernels"),
    "upward import": (
        {"kernels": "from uaii.backends import Backend\n"},
        r"uaii-kernels \(layer 1\) imports uaii.backends, expected imports from lower layers only"),
    "undeclared third-party module": (
        {"storage": "def f():\n    import rich\n"},
        r"uaii-storage imports rich, expected its distribution in \[project\].dependencies or an extra"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_problem_is_reported_with_file_and_line(case: str, tmp_path: Path) -> None:
    code, message = CASES[case]
    errors, _ = deps.check(_workspace(tmp_path, **code))
    assert len(errors) >= 1 and re.search(message, "\n".join(errors)), errors


def test_declarations_must_point_downward_and_match_the_uv_sources(tmp_path: Path) -> None:
    root = _workspace(tmp_path)
    _package(root, "runtime", ("ir",), extra='[project.optional-dependencies]\nx = ["uaii-capi"]\n')
    text = (root / "packages" / "uaii-ir" / "pyproject.toml").read_text()
    (root / "packages" / "uaii-ir" / "pyproject.toml").write_text(text.replace(
        "dependencies = [\n", 'dependencies = [\n    "uaii-planner>=0.1,<0.2",\n'))
    errors = "\n".join(deps.check(root)[0])
    assert "found uaii-planner (layer 2) declared by uaii-ir (layer 0)" in errors
    assert "uaii-planner is in [project].dependencies but not in [tool.uv.sources]" in errors


def test_a_package_test_importing_a_sibling_outside_its_dependencies_is_reported(tmp_path: Path) -> None:
    """tests/<name> runs in .venv-iso-<name>: a sibling outside the package's dependencies is not installed there,
    and a test that skips when it is missing would silently never run in isolation."""
    root = _workspace(tmp_path)
    (root / "tests" / "planner").mkdir(parents=True)
    (root / "tests" / "planner" / "test_x.py").write_text(
        "import pytest\nfrom uaii.storage import PAGE\n\ndef test():\n    pytest.importorskip('uaii.backends.cpu')\n")
    errors = deps.check(root)[0]
    assert len(errors) == 1 and "tests/planner/test_x.py:5: a test of uaii-planner imports uaii.backends.cpu" in \
        errors[0] and "(ir, planner, storage)" in errors[0]


def test_a_declared_sibling_nothing_imports_is_a_note(tmp_path: Path) -> None:
    errors, notes = deps.check(_workspace(tmp_path, planner="import uaii.ir\n"))
    assert errors == [] and notes == ["[deps] note: uaii-planner declares uaii-storage but its src/ imports nothing "
                                      "from it"]


def test_the_script_exits_1_and_names_the_problem(tmp_path: Path) -> None:
    root = _workspace(tmp_path, kernels="from uaii.storage import PAGE\n")
    proc = subprocess.run([sys.executable, REPO / "scripts" / "check_deps.py", "--root", root], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "uaii-kernels imports uaii.storage" in proc.stderr, proc.stderr
    ok = subprocess.run([sys.executable, REPO / "scripts" / "check_deps.py"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


# --- the isolated environments --------------------------------------------------------------------------------
def test_the_expected_set_is_the_declared_closure() -> None:
    assert isolated.expected("uaii-ir") == {"uaii-ir"}
    assert isolated.expected("uaii-planner") == {"uaii-ir", "uaii-planner", "uaii-storage"}
    assert isolated.expected("uaii-backends") == {"uaii-ir", "uaii-kernels", "uaii-storage", "uaii-backends"}
    assert isolated.expected("uaii-capi") == {f"uaii-{p}" for p in PACKAGES}
    with pytest.raises(SystemExit, match="expected a workspace package, found 'uaii-nope'"):
        isolated.expected("uaii-nope")


def test_check_isolated_refuses_a_venv_with_an_undeclared_sibling(capsys: pytest.CaptureFixture[str]) -> None:
    installed = isolated.installed()
    if installed != {f"uaii-{p}" for p in PACKAGES}:
        pytest.skip(f"needs the workspace .venv with every package (found {sorted(installed)})")
    assert isolated.main(["uaii-planner"]) == 1
    err = capsys.readouterr().err
    assert "not declared: ['uaii-backends', 'uaii-capi', 'uaii-kernels', 'uaii-loaders', 'uaii-runtime', " \
           "'uaii-tokenizers']; missing: none" in err
    assert isolated.main(["uaii-capi"]) == 0


def _root_groups() -> dict[str, list[object]]:
    with open(REPO / "pyproject.toml", "rb") as f:
        groups: dict[str, list[object]] = tomllib.load(f)["dependency-groups"]
    return groups


def _distribution(requirement: str) -> str:
    """The normalized distribution name of a requirement string (``mlx[cpu]==0.32.4; ...`` → ``mlx``)."""
    return deps.normalize(re.split(r"[\[<>=~!;\s]", requirement, maxsplit=1)[0])


def _members(groups: dict[str, list[object]], name: str) -> set[str]:
    """The requirement strings of a group with the groups it includes, recursively."""
    out: set[str] = set()
    for item in groups[name]:
        if isinstance(item, str):
            out.add(item)
        else:
            assert isinstance(item, dict) and set(item) == {"include-group"}, item
            out |= _members(groups, str(item["include-group"]))
    return out


def test_every_package_has_a_test_group_of_test_tools_and_references_only() -> None:
    groups = _root_groups()
    pins: dict[str, set[str]] = {}
    for items in groups.values():
        for item in items:
            if isinstance(item, str):
                pins.setdefault(_distribution(item), set()).add(item)
    assert {n: p for n, p in pins.items() if len(p) > 1} == {}  # one pin per distribution, whatever the group
    references = {_distribution(i) for g in ("dev", "reference") for i in _members(groups, g)}
    for pkg in PACKAGES:
        items = groups[f"test-{pkg}"]
        assert {"include-group": "test"} in items, pkg
        names = {_distribution(i) for i in _members(groups, f"test-{pkg}")}
        assert not {n for n in names if n.startswith("uaii-")}, pkg  # a sibling is a dependency, never a test tool
        assert names <= references, (pkg, names - references)  # the test references of the full run, no others


def _make_n(*targets: str) -> str:
    make = shutil.which("make")
    assert make is not None, "make is a requirement of the README"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    proc = subprocess.run([make, "-n", "--no-print-directory", *targets], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_test_pkg_runs_that_package_s_tests() -> None:
    """Regression: test-% was listed in .PHONY, so make skipped the pattern rule and `make test-ir` did nothing."""
    assert re.search(r"-m pytest .*tests/ir$", _make_n("test-ir"), re.M)


def test_make_isolation_syncs_checks_and_tests_every_package_alone() -> None:
    out = _make_n("isolation")
    for pkg in PACKAGES:
        venv = f"UV_PROJECT_ENVIRONMENT=.venv-iso-{pkg} "
        assert re.search(rf"^{venv}\S+ sync --package uaii-{pkg} --no-default-groups --group test-{pkg}$", out, re.M)
        assert re.search(rf"^{venv}\S+ run --no-sync python scripts/check_isolated.py uaii-{pkg}$", out, re.M)
        assert re.search(rf'^{venv}\S+ run --no-sync python -m pytest .*-m "not slow" -p no:cacheprovider tests/{pkg}$',
                         out, re.M)
    everything = _make_n("test")
    assert "--group test-capi" in everything and "scripts/check_deps.py" in everything
