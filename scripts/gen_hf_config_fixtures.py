"""Regenerate tests/loaders/fixtures/hf_configs/<generation>/*.json: the config.json files transformers writes.

The loader must read what both transformers 4.x and 5.x write (5.x moved RoPE into ``rope_parameters``). Run
this once with each generation; it saves every variant of ``tests/loaders/hf_generations.py`` with the
transformers it runs under and keeps only ``config.json``, in ``v4/`` or ``v5/`` after the major version:

    uv run --no-sync python scripts/gen_hf_config_fixtures.py          # the workspace's transformers 4.57
    python3 -m venv /tmp/tf5 && /tmp/tf5/bin/pip install torch==2.13.0 'transformers>=5,<6'  # a CPU torch
    /tmp/tf5/bin/python scripts/gen_hf_config_fixtures.py              # transformers 5.x

The 5.x environment is throwaway and never part of the workspace; only the JSON files are checked in.
``transformers_version`` in each file records which release wrote it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "loaders"))

from hf_generations import FIXTURES, VARIANTS, save_variant  # noqa: E402


def main() -> int:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="variants to write (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: fixtures/hf_configs/vN)")
    args = parser.parse_args()
    major = transformers.__version__.split(".")[0]
    out = args.out or FIXTURES / f"v{major}"
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            config = json.loads((save_variant(name, Path(tmp)) / "config.json").read_text())
        (out / f"{name}.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        print(f"{out / name}.json  (transformers {transformers.__version__})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
