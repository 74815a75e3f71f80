"""uaii.planner — see packages/uaii-planner/README.md. Its public API grows here as the package is implemented."""

from importlib.metadata import version as _version

__version__ = _version("uaii-planner")
__all__ = ["__version__"]
