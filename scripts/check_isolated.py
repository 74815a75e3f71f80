"""Fail unless exactly one uaii-* distribution is installed in this environment.

The isolation check proves a package stands alone: `make isolation-ir` syncs a venv with uaii-ir only and runs
its tests there; this script guards against a sibling sneaking in through a dependency.
"""

from __future__ import annotations

import sys
from importlib.metadata import distributions


def main() -> int:
    want = sys.argv[1]
    found = sorted({d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith("uaii-")})
    if found != [want]:
        print(f"[isolation] expected only {want} installed, found {found}", file=sys.stderr)
        return 1
    print(f"[isolation] only {want} installed: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
