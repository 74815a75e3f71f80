"""Check the workspace's import graph against what each package declares (run by `make lint`).

    python scripts/check_deps.py            # the repository this script lives in
    python scripts/check_deps.py --root D   # another checkout

Why: a package imported but not declared works in the workspace's one `.venv` (every package is installed there)
and breaks for a user who installs that package alone; a private module (`uaii.x._y`) of another package is not
part of its API and may change under the importer. So, for every ``packages/uaii-<name>``:

- every import of a sibling in ``src/`` (ast: every import statement, function-level ones included, and
  ``importlib.import_module("uaii.x...")`` with a literal name) must be declared in ``[project].dependencies``
  and in ``[tool.uv.sources]`` (``workspace = true``);
- no import of a sibling names a private module (a component after ``uaii.<x>`` that starts with ``_``);
- dependencies point downward: a package may depend only on packages of a lower layer (``LAYERS``, which is
  DESIGN §2's picture); that holds for what it imports and for what it declares;
- a module neither of the standard library nor of the workspace comes from a distribution the package declares
  (a dependency or an extra): the workspace's `.venv` holds many that a user's does not;
- ``tests/<name>`` imports only its package and what that package depends on (transitively), since
  `make isolation` runs those tests in a venv that holds nothing else.

A sibling that is declared but never imported is reported as a note (it is installed for nothing), not an error.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREFIX = "uaii-"
# DESIGN §2 as layers: a package depends only on packages of a lower layer (never upward, never sideways).
LAYERS: dict[str, int] = {
    "ir": 0,
    "kernels": 1, "storage": 1, "tokenizers": 1,
    "backends": 2, "loaders": 2, "planner": 2,
    "runtime": 3,
    "capi": 4,
}
# Third-party modules whose distribution has another name (none of today's: numpy, cffi, flatbuffers, rich, ...).
MODULE_DISTRIBUTIONS: dict[str, str] = {"yaml": "pyyaml", "PIL": "pillow", "google": "protobuf",
                                        "cuda": "cuda-bindings"}
# Distributions that ship a shared library another dependency loads at run time (nothing imports them): the
# library's distribution -> the distribution that loads it (both belong in the same extra).
RUNTIME_LIBRARIES: dict[str, str] = {"nvidia-cuda-nvrtc": "cuda-bindings"}  # libnvrtc, found by cuda.pathfinder


@dataclass(frozen=True)
class Use:
    """One import of ``uaii.<target>...`` (``module`` is the full dotted name) at ``path:line``."""

    target: str
    module: str
    path: Path
    line: int


@dataclass
class Package:
    """What ``packages/uaii-<name>/pyproject.toml`` declares about its siblings."""

    name: str
    root: Path
    dependencies: set[str] = field(default_factory=set)   # sibling import names in [project].dependencies
    sources: set[str] = field(default_factory=set)        # sibling import names with workspace = true
    third_party: set[str] = field(default_factory=set)    # other distributions, [project].dependencies and extras


def _requirement_name(req: str) -> str:
    """The normalized distribution name of a requirement (PEP 503: lower case, runs of -_. as one -)."""
    return normalize(re.split(r"[\s\[<>=!~;@]", req.strip(), maxsplit=1)[0])


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_packages(root: Path = REPO) -> dict[str, Package]:
    """Every workspace package by import name (``ir`` for uaii-ir), with its declared siblings."""
    found: dict[str, Package] = {}
    for pyproject in sorted((root / "packages").glob(f"{PREFIX}*/pyproject.toml")):
        with open(pyproject, "rb") as f:
            data = tomllib.load(f)
        pkg = Package(pyproject.parent.name.removeprefix(PREFIX), pyproject.parent)
        project = data.get("project", {})
        for req in project.get("dependencies", []):
            dist = _requirement_name(req)
            if dist.startswith(PREFIX):
                pkg.dependencies.add(dist.removeprefix(PREFIX))
            else:
                pkg.third_party.add(dist)
        for reqs in project.get("optional-dependencies", {}).values():
            pkg.third_party.update(d for d in map(_requirement_name, reqs) if not d.startswith(PREFIX))
        for dist, spec in data.get("tool", {}).get("uv", {}).get("sources", {}).items():
            if dist.startswith(PREFIX) and isinstance(spec, dict) and spec.get("workspace") is True:
                pkg.sources.add(dist.removeprefix(PREFIX))
        found[pkg.name] = pkg
    return found


def closure(packages: dict[str, Package], name: str) -> set[str]:
    """``name`` and every sibling it depends on, directly or through another sibling (declarations only)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        n = todo.pop()
        if n not in seen and n in packages:
            seen.add(n)
            todo.extend(packages[n].dependencies)
    return seen


def _imported(node: ast.AST) -> Iterator[str]:
    """Absolute module names an ast node imports; ``from a import _b`` also yields ``a._b`` (``_b`` may be a
    private module, as in ``from uaii.kernels import _native``)."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        yield node.module
        # `from uaii import loaders` imports uaii.loaders: in a namespace package every name is a module
        yield from (f"{node.module}.{a.name}" for a in node.names
                    if a.name.startswith("_") or (node.module == "uaii" and a.name != "*"))
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str) and _callee(node) in ("import_module", "importorskip")):
        yield node.args[0].value


def _callee(call: ast.Call) -> str | None:
    """``f`` of ``f(...)`` or of ``x.f(...)``."""
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None)


def imports(files: Iterator[Path]) -> Iterator[Use]:
    """Every absolute import in ``files``; ``target`` is the top-level module (``uaii.<x>``: ``x``)."""
    for path in files:
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            for module in _imported(node):
                parts = module.split(".")
                if parts[0] == "uaii" and len(parts) > 1:
                    yield Use(parts[1], module, path, getattr(node, "lineno", 0))
                elif parts[0] != "uaii":
                    yield Use("", module, path, getattr(node, "lineno", 0))


def uses(files: Iterator[Path]) -> Iterator[Use]:
    """Every import of a ``uaii.<x>`` module in ``files``."""
    return (u for u in imports(files) if u.target)


def _third_party(pkg: Package, root: Path) -> list[str]:
    """A module that is neither the standard library's nor a workspace package's must come from a distribution
    the package declares (a dependency or an extra): the workspace's .venv has many that a user's has not."""
    errors = []
    for use in imports(iter(sorted((pkg.root / "src").rglob("*.py")))):
        top = use.module.split(".")[0]
        if use.target or top in sys.stdlib_module_names or top == "__future__":
            continue
        if normalize(MODULE_DISTRIBUTIONS.get(top, top)) not in pkg.third_party:
            errors.append(f"[deps] {_where(use, root)}: {PREFIX}{pkg.name} imports {top}, expected its distribution "
                          f"in [project].dependencies or an extra, found it undeclared")
    return errors


def _private(use: Use) -> bool:
    return any(p.startswith("_") for p in use.module.split(".")[2:])


def _where(use: Use, root: Path) -> str:
    return f"{use.path.relative_to(root)}:{use.line}"


def check_sources(packages: dict[str, Package], root: Path) -> tuple[list[str], list[str]]:
    """(errors, notes) of every package's src/ against its declarations and the layers."""
    errors: list[str] = []
    notes: list[str] = []
    for name, pkg in packages.items():
        dist = PREFIX + name
        if name not in LAYERS:
            errors.append(f"[deps] expected every package in check_deps.LAYERS, found {dist} missing there")
            continue
        for dep in sorted(pkg.dependencies - pkg.sources):
            errors.append(f"[deps] {dist}/pyproject.toml: {PREFIX}{dep} is in [project].dependencies but not in "
                          f"[tool.uv.sources] (expected `{PREFIX}{dep} = {{ workspace = true }}`)")
        for dep in sorted(pkg.sources - pkg.dependencies):
            errors.append(f"[deps] {dist}/pyproject.toml: {PREFIX}{dep} is in [tool.uv.sources] but not in "
                          f"[project].dependencies")
        for dep in sorted(pkg.dependencies):
            if dep in LAYERS and LAYERS[dep] >= LAYERS[name]:
                errors.append(f"[deps] {dist}/pyproject.toml: expected dependencies on lower layers only, found "
                              f"{PREFIX}{dep} (layer {LAYERS[dep]}) declared by {dist} (layer {LAYERS[name]})")
        by_target: dict[str, list[Use]] = {}
        for use in uses(sorted((pkg.root / "src").rglob("*.py"))):
            if use.target != name:
                by_target.setdefault(use.target, []).append(use)
        for target, places in sorted(by_target.items()):
            where = f"{_where(places[0], root)}" + (f" and {len(places) - 1} more" if len(places) > 1 else "")
            if target not in packages:
                errors.append(f"[deps] {where}: {dist} imports {places[0].module}, expected a module of a "
                              f"workspace package, found no {PREFIX}{target}")
                continue
            if target not in pkg.dependencies:
                errors.append(f"[deps] {where}: {dist} imports uaii.{target}, expected {PREFIX}{target} in its "
                              f"[project].dependencies, found it undeclared")
            if LAYERS.get(target, -1) >= LAYERS[name]:
                errors.append(f"[deps] {where}: {dist} (layer {LAYERS[name]}) imports uaii.{target}, expected "
                              f"imports from lower layers only, found {PREFIX}{target} (layer {LAYERS.get(target)})")
        for use in (u for places in by_target.values() for u in places):
            if _private(use):
                errors.append(f"[deps] {_where(use, root)}: {dist} imports {use.module}, a private module of "
                              f"{PREFIX}{use.target}; expected its public API (uaii.{use.target} or a module "
                              f"without a leading underscore)")
        errors += _third_party(pkg, root)
        for dep in sorted(pkg.dependencies - by_target.keys()):
            notes.append(f"[deps] note: {dist} declares {PREFIX}{dep} but its src/ imports nothing from it")
    return errors, notes


def check_tests(packages: dict[str, Package], root: Path) -> list[str]:
    """tests/<name> imports only what `make isolation-<name>` installs: the package and its dependencies."""
    errors: list[str] = []
    for name in packages:
        folder = root / "tests" / name
        if not folder.is_dir():
            continue
        allowed = closure(packages, name)
        for use in uses(sorted(folder.rglob("*.py"))):
            if use.target not in allowed:
                errors.append(f"[deps] {_where(use, root)}: a test of {PREFIX}{name} imports {use.module}, expected "
                              f"{PREFIX}{name} or its dependencies ({', '.join(sorted(allowed))}), found "
                              f"{PREFIX}{use.target}; move the test to tests/ of a package that depends on both")
    return errors


def check(root: Path = REPO) -> tuple[list[str], list[str]]:
    """(errors, notes) for the checkout at ``root``."""
    packages = read_packages(root)
    if not packages:
        return [f"[deps] expected packages under {root / 'packages'}, found none"], []
    errors, notes = check_sources(packages, root)
    return errors + check_tests(packages, root), notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout to check (default: this one)")
    args = parser.parse_args(argv)
    errors, notes = check(args.root.resolve())
    for line in notes:
        print(line)
    for line in errors:
        print(line, file=sys.stderr)
    if errors:
        print(f"[deps] {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print(f"[deps] {len(read_packages(args.root.resolve()))} packages: imports declared, downward, public: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
