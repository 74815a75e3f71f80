"""uaii.runtime.serve — `uaii serve`: an OpenAI-compatible HTTP server over one loaded model (and the dashboard).

It needs the ``serve`` extra (starlette, uvicorn, pydantic). Importing this package without it is
an ImportError whose message names the extra, so `uaii serve` can say what to install instead of crashing deep
inside an import; nothing else in uaii.runtime imports it.

    from uaii.runtime.serve import ServerState, create_app
    app = create_app(ServerState(model="model.gguf"))   # any ASGI server runs it; `uaii serve` uses uvicorn

``ray_replicas`` deploys the same app on Ray Serve replicas (``uaii serve --ray``, the ``ray`` extra); nothing here
imports it. See docs/serve.md.
"""

from __future__ import annotations

from importlib.util import find_spec

EXTRA = "pip install 'uaii-runtime[serve]'"
REQUIRED = ("starlette", "uvicorn", "pydantic")

_missing = [name for name in REQUIRED if find_spec(name) is None]
if _missing:
    raise ImportError(f"[serve] uaii serve needs {', '.join(_missing)}: {EXTRA}", name=_missing[0])

from .app import build_routes, create_app  # noqa: E402  (after the check: these import starlette)
from .state import ServerState  # noqa: E402

__all__ = ["EXTRA", "ServerState", "build_routes", "create_app"]
