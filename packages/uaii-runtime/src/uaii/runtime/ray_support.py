"""Ray, imported the one way uaii uses it: its workers run this process's interpreter.

Ray 2.43+ notices a driver started by ``uv run`` and starts every worker with that ``uv run`` command again, in a
working directory it uploads (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``, on by default). For uaii that is wrong twice: a
worker then resolves the project environment anew from its own directory — with ``UV_PROJECT_ENVIRONMENT`` relative,
as the Makefile's per-package venvs set it, an empty one without Ray (``No module named 'ray'`` in every worker, and
every stage or replica waits until the timeout) — and may install packages while the model runs, which uaii never
does. Without the hook Ray starts workers with the driver's own interpreter on this node (``sys.executable``) and
with the node's on others (the Python ``ray start`` ran there), which is what the stages and replicas need. The
setting is read when ``ray`` is first imported, so every uaii entry point imports Ray through :func:`import_ray`; a
caller who imported Ray before keeps the setting it had.
"""

from __future__ import annotations

import os
from typing import Any

UV_HOOK_ENV = "RAY_ENABLE_UV_RUN_RUNTIME_ENV"


def import_ray() -> Any:
    """The ``ray`` module, its ``uv run`` hook off unless the environment says otherwise (see the module doc)."""
    os.environ.setdefault(UV_HOOK_ENV, "0")
    import ray

    return ray


__all__ = ["UV_HOOK_ENV", "import_ray"]
