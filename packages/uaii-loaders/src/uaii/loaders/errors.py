"""Errors of uaii-loaders: format errors come from uaii.ir (:class:`FormatError`); the rest are here."""

from __future__ import annotations

import importlib
from types import ModuleType

from uaii.ir.errors import UaiiError


class LoaderError(UaiiError):
    """A model cannot be loaded for a reason other than a corrupt file (unknown architecture, missing "
      "file...)."""

    component = "loaders"


class MissingDependency(LoaderError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import an optional module, or fail with one line that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(
            f"{what} needs the optional package '{module}'; install it with: "
            f"pip install 'uaii-loaders[{extra}]'") from None
