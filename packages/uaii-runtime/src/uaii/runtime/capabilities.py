"""The Session's side of the backend contract: what it asks of a backend follows from the backend's declared
:class:`~uaii.backends.base.Capabilities`, never from its name or from probing its methods.

An option the backend does not declare is a :class:`SessionError` that names the backend and the option, raised
before anything is planned or compiled (a budget that could not be kept, an f16 KV cache a backend does not have, a
thread count for a backend without a pool): never silently dropped. What is declared is passed through: the standard
compile options, the streaming ones when the backend streams weights, the backend-specific ones it lists, and the
KV state options it takes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from uaii.runtime.errors import SessionError
from uaii.runtime.options import SessionOptions

if TYPE_CHECKING:
    from uaii.backends.base import Backend, Capabilities

log = logging.getLogger("uaii.runtime")


def check_backend(backend: Backend, options: SessionOptions, *, generative: bool, model: str) -> None:
    """Refuse the options ``backend`` cannot honour (all of them in one message)."""
    caps, o = backend.capabilities, options
    problems = []
    if o.n_threads is not None and not caps.threads:
        problems.append(f"n_threads={o.n_threads}: it has no thread pool (capabilities.threads is False)")
    if o.budget_bytes and not caps.streams_weights:
        problems.append(f"budget_bytes={o.budget_bytes}: it does not stream weights (capabilities.streams_weights "
                        "is False), so the budget could not be kept; run without a budget or on a backend that "
                        "streams")
    problems += _device_budget_problems(backend, o)
    problems += [f"{k}={v!r}: not among its compile options ({_listed(caps.compile_options)})"
                 for k, v in o.backend_specific().items() if k not in caps.compile_options]
    if generative:
        problems += _kv_problems(caps, o, model)
    if problems:
        raise SessionError(f"[runtime] the {backend.name} backend cannot run {model} with "
                           + "; ".join(problems))


def _device_budget_problems(backend: Backend, o: SessionOptions) -> list[str]:
    """``gpu_budget_bytes`` for a backend without device memory: refused when the backend was named, a warning
    (once, here, not at every plan) when ``device="auto"`` fell back to it."""
    if not o.gpu_budget_bytes or backend.capabilities.device_memory:
        return []
    if o.device.strip().lower() != "auto":
        return [f"gpu_budget_bytes={o.gpu_budget_bytes}: the {backend.name} backend has no device memory "
                "(capabilities.device_memory is 0); its memory is the host's, which budget_bytes covers"]
    log.warning("[runtime] gpu_budget_bytes=%d does not apply: device auto chose %s, which runs from host memory",
                o.gpu_budget_bytes, backend.name)
    return []


def _kv_problems(caps: Capabilities, o: SessionOptions, model: str) -> list[str]:
    if not caps.kv_dtypes:
        return [f"a KV cache: {model} is a decoder and the backend keeps no KV state (capabilities.kv_dtypes is "
                "empty)"]
    problems = []
    if o.kv_dtype not in caps.kv_dtypes:
        problems.append(f"kv_dtype={o.kv_dtype!r}: its KV states hold {_listed(caps.kv_dtypes)}")
    if o.kv_positions not in caps.kv_positions:
        problems.append(f"kv_positions={o.kv_positions!r}: its KV states take positions "
                        f"{_listed(caps.kv_positions)}")
    if o.kv_window and not caps.kv_window:
        problems.append(f"kv_window={o.kv_window}: its KV states keep no resident window (capabilities.kv_window is "
                        "False)")
    return problems


def _listed(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def compile_options(caps: Capabilities, options: SessionOptions, streaming: dict[str, Any],
                    **standard: Any) -> dict[str, Any]:
    """Keyword options of ``backend.compile``: ``standard`` ones (``max_tokens``, ``memory_reuse``, ``kv_state``),
    the ``streaming`` ones (empty unless the backend streams weights: :func:`check_backend` refused a budget
    otherwise), and the backend-specific options it declares."""
    kw = {"max_tokens": options.max_batch, "memory_reuse": options.enable_memory_reuse, **standard}
    if streaming and caps.streams_weights:
        kw.update(streaming)
    kw.update(options.backend_options(caps.compile_options))
    return kw


def kv_state_options(options: SessionOptions, context: int) -> dict[str, Any]:
    """Keyword options of ``exe.new_state`` for a state of ``context`` tokens: the dtype, and positions and the
    window only where they differ from the defaults (a backend without ``kv_window`` need not take ``window``;
    :func:`check_backend` checked the rest), the window only where it is one (uaii.runtime.planning.windowed)."""
    from uaii.runtime.planning import windowed

    o = options
    kw: dict[str, Any] = {"dtype": o.kv_dtype}
    if o.kv_positions != "absolute":
        kw["positions"] = o.kv_positions
    if windowed(o, context):
        kw.update(window=o.kv_window, sinks=o.kv_sinks)
    return kw


__all__ = ["check_backend", "compile_options", "kv_state_options"]
