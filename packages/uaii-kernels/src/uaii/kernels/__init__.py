"""uaii.kernels — see packages/uaii-kernels/README.md. Its public API grows here as the package is implemented."""

from importlib.metadata import version as _version

__version__ = _version("uaii-kernels")
__all__ = ["__version__"]
