"""Status codes of the C API and how a Python exception becomes one (plus the last-error message).

The numbers mirror ``uaii_status`` in uaii/c_api/uaii.h (checked by tests/capi against the compiled library) and
are never reused or renumbered.
"""

from __future__ import annotations

import enum

from uaii.ir.errors import UaiiError, WeightRefError


class Status(enum.IntEnum):
    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_NOT_FOUND = 2
    ERR_IO = 3
    ERR_CONFIG = 4
    ERR_PLUGIN = 5
    ERR_ABI = 6
    ERR_NOT_IMPLEMENTED = 7
    ERR_INTERNAL = 8


STATUS_NAMES: dict[int, str] = {
    Status.OK: "ok", Status.ERR_INVALID_ARGUMENT: "invalid_argument", Status.ERR_NOT_FOUND: "not_found",
    Status.ERR_IO: "io", Status.ERR_CONFIG: "config", Status.ERR_PLUGIN: "plugin", Status.ERR_ABI: "abi",
    Status.ERR_NOT_IMPLEMENTED: "not_implemented", Status.ERR_INTERNAL: "internal",
}


def status_name(status: int) -> str:
    """As ``uaii_status_name``: the lower-case name, "unknown" for any other value."""
    return STATUS_NAMES.get(status, "unknown")


class CapiError(UaiiError):
    """An error the C API reports with a specific status; the message becomes ``uaii_last_error()``."""

    component = "capi"

    def __init__(self, status: Status, message: str) -> None:
        self.status = Status(status)
        super().__init__(message)


def invalid(message: str) -> CapiError:
    return CapiError(Status.ERR_INVALID_ARGUMENT, message)


def _class_table() -> list[tuple[type[BaseException], Status]]:
    """Exception classes → status, most specific first. Optional packages are looked up lazily."""
    table: list[tuple[type[BaseException], Status]] = [
        (WeightRefError, Status.ERR_INVALID_ARGUMENT),
        (FileNotFoundError, Status.ERR_NOT_FOUND),
        (NotADirectoryError, Status.ERR_NOT_FOUND),
        (OSError, Status.ERR_IO),
        (NotImplementedError, Status.ERR_NOT_IMPLEMENTED),
        (UnicodeError, Status.ERR_INVALID_ARGUMENT),
    ]
    try:
        from uaii.ir.registry import PluginError, UnknownOpError
        table[:0] = [(UnknownOpError, Status.ERR_NOT_IMPLEMENTED), (PluginError, Status.ERR_PLUGIN)]
    except ImportError:  # pragma: no cover - uaii-ir always ships its registry
        pass
    try:
        from uaii.loaders.errors import MissingDependency
        table.insert(0, (MissingDependency, Status.ERR_PLUGIN))
    except ImportError:  # pragma: no cover - uaii-loaders is a dependency of uaii-runtime
        pass
    try:
        from uaii.backends import BackendError, UnsupportedOpError
        table[:0] = [(UnsupportedOpError, Status.ERR_NOT_IMPLEMENTED), (BackendError, Status.ERR_PLUGIN)]
    except ImportError:  # pragma: no cover - uaii-backends is a dependency of uaii-runtime
        pass
    try:
        from uaii.runtime import PresetError
        table.insert(0, (PresetError, Status.ERR_CONFIG))
    except ImportError:  # pragma: no cover
        pass
    try:
        from uaii.ir import UnsupportedDType
        table.insert(0, (UnsupportedDType, Status.ERR_NOT_IMPLEMENTED))
    except ImportError:  # pragma: no cover
        pass
    table += [(UaiiError, Status.ERR_INVALID_ARGUMENT), (ValueError, Status.ERR_INVALID_ARGUMENT)]
    return table


_TABLE: list[tuple[type[BaseException], Status]] | None = None


def status_of(exc: BaseException) -> Status:
    """The status a failure is reported with: a CapiError says it, other exceptions go by class."""
    global _TABLE
    if isinstance(exc, CapiError):
        return exc.status
    if _TABLE is None:
        _TABLE = _class_table()
    for cls, status in _TABLE:
        if isinstance(exc, cls):
            return status
    return Status.ERR_INTERNAL


def error_message(function: str, exc: BaseException) -> str:
    """``[capi] <function>: <what happened>`` — our errors keep their own ``[component]`` prefix."""
    text = str(exc)
    if isinstance(exc, CapiError) and text.startswith("[capi] "):
        text = text[len("[capi] "):]
    elif not isinstance(exc, UaiiError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"[capi] {function}: {text}"
