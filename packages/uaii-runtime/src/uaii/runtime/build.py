"""From a plan to an executable: the weight store the plan asks for, the device residency, the compiled graph.

One rule for every graph a process runs — a Session's whole model and a pipeline stage's layers alike: under a
budget the store streams what the storage plan streams and pins the rest; without one every weight is mapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from uaii.runtime.budget import kv_cache_bytes, streaming_setup
from uaii.runtime.capabilities import compile_options
from uaii.runtime.gpu_budget import DeviceResidency, device_streaming
from uaii.runtime.model import ModelBundle
from uaii.runtime.options import SessionOptions

if TYPE_CHECKING:
    from uaii.backends.base import Backend, Executable
    from uaii.ir import Graph


@dataclass
class Built:
    """What :func:`build_executable` made; the caller owns ``exe`` and ``store`` (closes both)."""

    exe: Executable
    store: Any
    stream_kw: dict[str, Any] = field(default_factory=dict)  # the streaming compile options ({}: mapped)
    device_residency: DeviceResidency | None = None  # weights on a device backend (gpu_budget.py)
    device_kw: dict[str, Any] = field(default_factory=dict)  # streaming options with the device's streamed list


def build_executable(graph: Graph, plan: Any, bundle: ModelBundle, options: SessionOptions, backend: Backend, *,
                     kv_slots: int, cached: bool) -> Built:
    """The store, the device residency and the executable of ``graph`` for ``plan``. ``kv_slots``: tokens of the
    KV cache a device backend holds beside the weights when ``cached`` (the graph has cached layers). Nothing is
    left open when it fails."""
    from uaii.storage import MmapStore

    o = options
    stream_kw: dict[str, Any] = {}
    store: Any = None
    try:
        if o.budget_bytes:
            store, stream_kw = streaming_setup(plan, graph, bundle, o)
        if not stream_kw:
            store = MmapStore(bundle.locations)
        on_device = cached and backend.capabilities.device_memory > 0  # the KV cache a device holds
        kv_device = kv_cache_bytes(graph, kv_slots, o.kv_dtype) if on_device else 0
        residency, device_kw = device_streaming(backend, graph, plan, o, stream_kw, kv_device)
        exe = backend.compile(graph, plan, store, **compile_options(backend.capabilities, o, device_kw))
    except BaseException:
        if store is not None:
            store.close()
        raise
    return Built(exe, store, stream_kw, residency, device_kw)


__all__ = ["Built", "build_executable"]
