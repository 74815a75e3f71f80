"""Finding backends by name (entry-point group ``uaii.backends``), listing them, and choosing a device.

Built-in backends are declared in uaii-backends' own pyproject under the same group, so a plugin backend is found
exactly like ``cpu``. An entry point names a backend class or instance; instances are cached per name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from uaii.backends.base import Backend, BackendError, DeviceStatus
from uaii.backends.config import ALLOW_SOFTWARE_ENV

ENTRY_POINT_GROUP = "uaii.backends"
LISTED = ("cpu", "cuda", "rocm", "metal", "vulkan", "webgpu")
"""The backends :func:`list_backends` always covers, in this order (plugins follow)."""

log = logging.getLogger("uaii.backends")
_instances: dict[str, Any] = {}


def _builtin_factories() -> dict[str, Callable[[], Any]]:
    from uaii.backends.cpu import CpuBackend
    from uaii.backends.gpu import GPU_BACKENDS

    return {"cpu": CpuBackend, **GPU_BACKENDS}


def _factories() -> dict[str, Any]:
    """name → entry-point target (a class or an instance); the built-ins back up a source tree without metadata."""
    found: dict[str, Any] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep
    for name, factory in _builtin_factories().items():
        found.setdefault(name, factory)
    return found


def backend_names() -> list[str]:
    """Every registered backend name: the built-in list first, then plugins alphabetically."""
    names = set(_factories())
    return [n for n in LISTED if n in names] + sorted(names - set(LISTED))


def get_backend(name: str) -> Any:
    """The backend registered under ``name`` (one instance per process)."""
    key = name.strip().lower()
    if key in _instances:
        return _instances[key]
    factories = _factories()
    if key not in factories:
        raise BackendError(f"[backend] unknown backend {name!r}; registered: {', '.join(backend_names())}")
    target = factories[key]
    try:
        obj = target.load() if hasattr(target, "load") and hasattr(target, "group") else target
    except Exception as exc:  # a broken plugin names itself instead of failing deep inside
        raise BackendError(f"[backend] backend plugin {key!r} ({target.value}) failed to import: {exc}") from exc
    backend = obj() if isinstance(obj, type) else obj
    _instances[key] = backend
    return backend


def list_backends() -> list[tuple[str, DeviceStatus]]:
    """(name, status) for every backend: cpu, cuda, rocm, metal, vulkan, webgpu, then plugins."""
    out = []
    for name in backend_names():
        try:
            status = get_backend(name).probe()
        except Exception as exc:
            status = DeviceStatus(False, f"probe failed: {type(exc).__name__}: {exc}")
        out.append((name, status))
    return out


def allow_software_devices() -> None:
    """Let every GPU backend of this process run on a software adapter when it is named (never for ``"auto"``):
    sets ``$UAII_ALLOW_SOFTWARE_GPU=1``, which the backends read when they choose their adapter. The process's
    opt-in, as the registry's backend instances are shared by every session of the process."""
    os.environ[ALLOW_SOFTWARE_ENV] = "1"


def select_device(device: str = "auto") -> Any:
    """The backend to run on. ``"auto"``: the first available native GPU backend, else the CPU — the fallback
    is logged (a warning with every GPU backend's reason), never silent. A software device (lavapipe, SwiftShader)
    is never chosen by ``"auto"``, whatever the opt-in: it runs only when named (``"webgpu"`` with
    ``UAII_ALLOW_SOFTWARE_GPU=1`` or ``--allow-software-adapter``). A named device must be available."""
    key = (device or "auto").strip().lower()
    backend: Backend
    if key != "auto":
        backend = get_backend(key.split(":", 1)[0])
        status = backend.probe()
        if not status.available:
            raise BackendError(f"[backend] device {device!r} is not available: {status.reason}")
        return backend
    reasons = []
    for name in backend_names():
        backend = get_backend(name)
        if backend.kind != "gpu":
            continue
        status = backend.probe()
        if status.available and not status.software and not status.not_auto:
            log.info("device auto: using %s (%s)", name, ", ".join(status.devices))
            return backend
        if not status.available:
            reasons.append(f"{name}: {status.reason}")
        elif status.software:
            reasons.append(f"{name}: only a software adapter ({', '.join(status.devices)}), which auto never picks; "
                           f"--device {name} runs on it")
        else:
            reasons.append(f"{name}: found {', '.join(status.devices)}; {status.not_auto}")
    log.warning("device auto: no usable GPU backend, falling back to cpu (%s)", "; ".join(reasons))
    return get_backend("cpu")


__all__ = ["ENTRY_POINT_GROUP", "LISTED", "allow_software_devices", "backend_names", "get_backend", "list_backends",
           "select_device"]
