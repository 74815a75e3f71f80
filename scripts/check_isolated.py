"""Fail unless exactly the expected uaii-* distributions are installed in this environment.

    python scripts/check_isolated.py uaii-planner      # expects uaii-planner, uaii-ir, uaii-storage

The isolation check proves a package stands alone: `make isolation-<name>` syncs a venv with that package and its
declared dependencies only and runs its tests there. This script guards against a sibling sneaking in (through a
dependency group, or a stale venv) and against one missing: the expected set is the package plus every sibling it
depends on, directly or through another sibling, as the pyproject files declare them (scripts/check_deps.py reads
them), never a list kept here.
"""

from __future__ import annotations

import sys
from importlib.metadata import distributions
from pathlib import Path

from check_deps import PREFIX, REPO, closure, read_packages


def expected(dist: str, root: Path = REPO) -> set[str]:
    """The uaii-* distributions an environment for ``dist`` alone must hold."""
    packages = read_packages(root)
    name = dist.removeprefix(PREFIX)
    if name not in packages:
        raise SystemExit(f"[isolation] expected a workspace package, found {dist!r} (packages: "
                         f"{', '.join(PREFIX + p for p in sorted(packages))})")
    return {PREFIX + p for p in closure(packages, name)}


def installed() -> set[str]:
    """The uaii-* distributions this interpreter sees."""
    return {d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith(PREFIX)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_isolated.py uaii-<name>", file=sys.stderr)
        return 2
    want, found = expected(argv[0]), installed()
    if found != want:
        extra, missing = sorted(found - want), sorted(want - found)
        print(f"[isolation] {sys.prefix}: expected {argv[0]} and its dependencies {sorted(want)}, found "
              f"{sorted(found)} (not declared: {extra or 'none'}; missing: {missing or 'none'})", file=sys.stderr)
        return 1
    print(f"[isolation] {argv[0]}: installed {sorted(found)}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
