"""uaii.capi — the stable C API of UAII (C API 0.3.0): ``libuaii`` and its header ``uaii/c_api/uaii.h``.

The library is built with cffi embedding and ships inside this package together with the header. A C build asks
this module where they are, as numpy's get_include does:

    cc app.c $(python -m uaii.capi --cflags --libs)

From Python: :func:`get_include`, :func:`get_library_dir`, :func:`cflags`, :func:`libs`. The status codes and
the option/parameter views are :class:`Status`, :class:`SessionConfig`, :class:`GenerateConfig`. See
docs/c-api.md.
"""

from importlib.metadata import version as _version

from uaii.capi.options import ComputeDType, FinishReason, GenerateConfig, GenerationStats, SessionConfig, WeightInit
from uaii.capi.paths import (
    C_API_VERSION,
    LIBRARY_NAME,
    cflags,
    get_include,
    get_library_dir,
    header_path,
    library_path,
    libs,
    python_libs,
)
from uaii.capi.status import STATUS_NAMES, CapiError, Status, status_name

__version__ = _version("uaii-capi")
__all__ = [
    "C_API_VERSION", "LIBRARY_NAME", "STATUS_NAMES", "CapiError", "ComputeDType", "FinishReason", "GenerateConfig",
    "GenerationStats", "SessionConfig", "Status", "WeightInit", "__version__", "cflags", "get_include",
    "get_library_dir", "header_path", "library_path", "libs", "python_libs", "status_name",
]
