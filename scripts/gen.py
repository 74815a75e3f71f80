"""Regenerate (or check) the generated files of the repository.

    python scripts/gen.py          # regenerate in place
    python scripts/gen.py --check  # regenerate into a temporary directory; exit 1 with a summary if stale

Generated files:

* ``packages/uaii-ir/src/uaii/ir/_fbs/``: FlatBuffers Python code, from ``schemas/uaii_ir.fbs`` by ``flatc``
  (``$FLATC``, default ``flatc`` on PATH; CI uses Debian's flatbuffers-compiler, flatc 2.0.8);
* ``docs/ops.md``: the op reference, rendered by ``uaii.ir.registry.render_markdown()`` once the registry
  exists.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schemas" / "uaii_ir.fbs"
FBS_DIR = REPO / "packages" / "uaii-ir" / "src" / "uaii" / "ir" / "_fbs"
FBS_NAMESPACE = ("uaii", "ir", "_fbs")  # namespace of the schema → directories flatc writes
OPS_DOC = REPO / "docs" / "ops.md"


def flatc() -> str:
    exe = os.environ.get("FLATC") or shutil.which("flatc")
    if not exe:
        sys.exit("gen: flatc not found; install it (Debian/Ubuntu: apt-get install flatbuffers-compiler) "
                 "or set FLATC")
    return exe


def generate_fbs(out: Path) -> None:
    """Write the FlatBuffers Python code for SCHEMA into directory ``out`` (created, must not exist)."""
    with tempfile.TemporaryDirectory(prefix="uaii-gen-") as tmp:
        subprocess.run([flatc(), "--python", "-o", tmp, str(SCHEMA)], check=True)
        shutil.copytree(Path(tmp).joinpath(*FBS_NAMESPACE), out)


def render_ops() -> str | None:
    """docs/ops.md text from the op registry, or None while the registry has no renderer."""
    try:
        registry = importlib.import_module("uaii.ir.registry")
    except ImportError:
        return None
    render: Callable[..., str] | None = getattr(registry, "render_markdown", None)
    if render is None:
        return None
    # Built-in ops only where the renderer can tell: plugins installed here must not leak into the docs.
    builtin = "builtin_only" in inspect.signature(render).parameters
    return render(builtin_only=True) if builtin else render()


def _files(root: Path) -> dict[str, str]:
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}


def diff_summary(label: str, committed: dict[str, str], fresh: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(committed) | set(fresh)):
        old, new = committed.get(name), fresh.get(name)
        if old == new:
            continue
        if old is None:
            lines.append(f"  {label}/{name}: missing (generate it)")
        elif new is None:
            lines.append(f"  {label}/{name}: not generated any more (delete it)")
        else:
            diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"committed/{name}",
                                             f"generated/{name}", lineterm="", n=1))
            lines.append(f"  {label}/{name}: differs ({len(diff)} diff lines); first lines:")
            lines.extend("    " + d for d in diff[:12])
    return lines


def check() -> int:
    with tempfile.TemporaryDirectory(prefix="uaii-gen-check-") as tmp:
        fresh_dir = Path(tmp) / "_fbs"
        generate_fbs(fresh_dir)
        problems = diff_summary(str(FBS_DIR.relative_to(REPO)), _files(FBS_DIR), _files(fresh_dir))
    ops = render_ops()
    if ops is not None:
        committed = OPS_DOC.read_text(encoding="utf-8") if OPS_DOC.exists() else None
        old = {"ops.md": committed} if committed is not None else {}
        problems += diff_summary("docs", old, {"ops.md": ops})
    if problems:
        print("gen --check: generated files are stale; run `make gen` and commit the result:",
              file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 1
    print("gen --check: generated files are current" + ("" if ops is not None else
                                                         " (docs/ops.md skipped: no registry renderer yet)"))
    return 0


def regenerate() -> int:
    with tempfile.TemporaryDirectory(prefix="uaii-gen-", dir=FBS_DIR.parent) as tmp:
        fresh_dir = Path(tmp) / "_fbs"
        generate_fbs(fresh_dir)
        old_dir = Path(tmp) / "_fbs.old"
        if FBS_DIR.exists():
            FBS_DIR.rename(old_dir)
        fresh_dir.rename(FBS_DIR)
    print(f"gen: wrote {FBS_DIR.relative_to(REPO)}/ from {SCHEMA.relative_to(REPO)}")
    ops = render_ops()
    if ops is not None:
        OPS_DOC.parent.mkdir(parents=True, exist_ok=True)
        OPS_DOC.write_text(ops, encoding="utf-8")
        print(f"gen: wrote {OPS_DOC.relative_to(REPO)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="fail when the committed generated files are stale")
    args = parser.parse_args(argv)
    return check() if args.check else regenerate()


if __name__ == "__main__":
    sys.exit(main())
