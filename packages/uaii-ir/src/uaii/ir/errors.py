"""The root of every UAII exception.

Every package derives its errors from `UaiiError` so that callers (the CLI, the C API) can turn any failure of ours
into a one-line message and a status code without catching foreign exceptions. Messages start with the component in
brackets: ``[gguf] model.gguf: ... at offset 0x1f000 ...``.
"""

from __future__ import annotations


class UaiiError(Exception):
    """Base class of all UAII errors."""

    component = "uaii"

    def __init__(self, message: str) -> None:
        if not message.startswith("["):
            message = f"[{self.component}] {message}"
        super().__init__(message)


class FormatError(UaiiError):
    """A file could not be decoded: says which file, the byte offset and what was expected."""

    component = "format"

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 component: str | None = None) -> None:
        self.path = path
        self.offset = offset
        prefix = f"[{component or self.component}] "
        where = ""
        if path is not None:
            where += f"{path}: "
        if offset is not None:
            message = f"{message} (at byte offset {offset:#x})"
        super().__init__(prefix + where + message)


class WeightRefError(UaiiError):
    """A weight reference is malformed, or resolves outside the allowed sandbox."""

    component = "weightref"


class UnsupportedDType(UaiiError):
    """A dtype is known but no implementation handles it here; names the dtype."""

    component = "dtype"

    def __init__(self, dtype: object, what: str = "") -> None:
        self.dtype = dtype
        name = getattr(dtype, "value", dtype)
        super().__init__(f"unsupported dtype {name!s}" + (f" for {what}" if what else ""))


class GraphError(UaiiError):
    """A graph is structurally unusable (used by builders before validation proper)."""

    component = "graph"
