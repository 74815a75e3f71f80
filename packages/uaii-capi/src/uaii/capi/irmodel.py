"""IR graphs opened through the C API: weight references resolved with ``weights_dir`` / ``weights_sandbox``, missing
weights failing closed or filled per ``weight_init``, and a runner for the graphs the Session cannot open as is.

``uaii.runtime.Session`` resolves an IR file's weight references against the file's own directory (which is also
its sandbox) and has no way to receive weights from elsewhere. When the C options ask for nothing else and every
weight resolves, the adapter opens the file with the Session; otherwise :class:`IrRunner` compiles the graph on the
selected backend (public uaii.backends API) with a weight source that serves the resolved files plus the filled
arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uaii.capi.options import SessionConfig, WeightInit
from uaii.capi.status import CapiError, Status
from uaii.ir import Graph, Tensor, WeightRef, is_symbolic

IR_SUFFIXES = (".uaii", ".uaii.json", ".json")


def is_ir_path(path: str) -> bool:
    return path.lower().endswith(IR_SUFFIXES)


def fill(t: Tensor, how: int) -> np.ndarray:
    """The filled value of a missing weight: zeros, ones, or element i (row-major) = i * 0.01."""
    if is_symbolic(t.shape):
        raise CapiError(Status.ERR_INVALID_ARGUMENT, f"cannot fill weight {t.name!r}: its shape "
                                                     f"{list(t.shape)} is not concrete")
    if t.dtype.is_quantized or t.dtype.numpy.kind != "f":
        raise CapiError(Status.ERR_NOT_IMPLEMENTED, f"cannot fill weight {t.name!r} of dtype {t.dtype.value}: "
                                                    "only plain float weights are filled")
    shape = tuple(int(d) for d in t.shape)
    n = int(np.prod(shape)) if shape else 1
    if how == WeightInit.ZEROS:
        values = np.zeros(n, np.float64)
    elif how == WeightInit.ONES:
        values = np.ones(n, np.float64)
    else:
        values = np.arange(n, dtype=np.float64) * 0.01
    return values.astype(t.dtype.numpy).reshape(shape)


@dataclass
class ResolvedWeights:
    """Where each weight of an IR graph comes from."""

    locations: dict[str, Any] = field(default_factory=dict)  # str(ref) -> storage location
    filled: dict[str, np.ndarray] = field(default_factory=dict)  # weight key -> filled array
    session_compatible: bool = True  # Session(path) would resolve every reference the same way
    warnings: list[str] = field(default_factory=list)


def _container(path: Path) -> Mapping[str, Any]:
    """Tensor table (name -> location) of a GGUF or safetensors file."""
    from uaii.loaders import open_gguf, open_safetensors
    from uaii.loaders.gguf import is_gguf

    if is_gguf(path):
        return open_gguf(path).tensors
    if path.suffix == ".safetensors":
        return open_safetensors(path).tensors
    raise CapiError(Status.ERR_INVALID_ARGUMENT, f"{path}: weight container format not recognized "
                                                 "(expected GGUF or safetensors)")


def _locate(t: Tensor, ref: WeightRef, base: Path, sandbox: str | None,
            containers: dict[Path, Mapping[str, Any]]) -> Any | None:
    """The storage location of ``ref``, or None when the weight cannot be loaded (no file / no such tensor)."""
    from uaii.storage import locate_raw_file

    path = ref.resolve(base, sandbox)  # WeightRefError (INVALID_ARGUMENT) when it escapes the sandbox
    if not path.is_file():
        return None
    if ref.is_raw_file:
        return locate_raw_file(ref, base, sandbox, dtype=t.dtype, shape=[int(d) for d in t.shape])
    if path not in containers:
        containers[path] = _container(path)
    info = containers[path].get(ref.tensor or "")
    if info is None:
        return None
    return info.expert(ref.expert) if ref.expert is not None else info


def resolve_weights(graph: Graph, ir_path: Path, config: SessionConfig) -> ResolvedWeights:
    """Resolve every weight; a missing one fails with NOT_FOUND (fail closed) unless allow_missing_weights."""
    ir_dir = ir_path.resolve().parent
    base = Path(config.weights_dir).resolve() if config.weights_dir else ir_dir
    sandbox = config.weights_sandbox
    out = ResolvedWeights(session_compatible=(base == ir_dir and sandbox in (None, "")))
    containers: dict[Path, Mapping[str, Any]] = {}
    for t in graph.weights:
        if t.is_constant:
            continue
        location, where = None, "it has no weight reference"
        if t.weight is not None:
            location = _locate(t, t.weight, base, sandbox or None, containers)
            where = f"{str(t.weight)!r} resolved against {base}"
            if out.session_compatible:
                try:
                    t.weight.resolve(ir_dir, ir_dir)  # the Session confines references to the file's directory
                except Exception:
                    out.session_compatible = False
        if location is not None:
            out.locations[str(t.weight)] = location
            continue
        out.session_compatible = False
        if not config.allow_missing_weights:
            raise CapiError(Status.ERR_NOT_FOUND, f"weight {t.name!r} cannot be loaded: {where} does not exist "
                                                  "(set allow_missing_weights and a weight_init to fill it)")
        if config.weight_init == WeightInit.NONE:
            raise CapiError(Status.ERR_NOT_FOUND, f"weight {t.name!r} cannot be loaded ({where}) and weight_init "
                                                  "is NONE: choose ZEROS, ONES or SEQUENCE to fill it")
        key = str(t.weight) if t.weight is not None else t.name
        out.filled[key] = fill(t, config.weight_init)
        out.warnings.append(f"weight {t.name!r} is missing ({where}); filled with "
                            f"{WeightInit(config.weight_init).name.lower()}")
    return out


class FilledSource:
    """Weight source: filled arrays first, then the store over the resolved files."""

    def __init__(self, store: Any, filled: Mapping[str, np.ndarray]) -> None:
        self.store = store
        self.filled = dict(filled)

    def acquire(self, ref: str) -> np.ndarray:
        arr = self.filled.get(str(ref))
        return arr if arr is not None else np.asarray(self.store.acquire(ref))

    def release(self, ref: str) -> None:
        if str(ref) not in self.filled:
            self.store.release(ref)

    def close(self) -> None:
        self.store.close()


def is_generative(graph: Graph) -> bool:
    """A decoder LM as the runtime sees one: tokens/positions inputs, logits first output, a KV cache."""
    return ("tokens" in graph.inputs and "positions" in graph.inputs and bool(graph.outputs)
            and graph.outputs[0] == "logits" and any(n.startswith("past_k.") for n in graph.inputs))


class IrRunner:
    """A non-generative IR graph compiled on the selected backend with the resolved and filled weights."""

    def __init__(self, graph: Graph, weights: ResolvedWeights, config: SessionConfig) -> None:
        from uaii.backends import select_device
        from uaii.storage import MmapStore

        if is_generative(graph):
            raise CapiError(Status.ERR_NOT_IMPLEMENTED,
                            "a generative IR graph whose weights are relocated (weights_dir, weights_sandbox) or "
                            "filled (allow_missing_weights) cannot be opened: uaii.runtime.Session takes no "
                            "weights other than the file's own references")
        self.graph = graph
        self.backend = select_device(config.device)
        if config.n_threads and hasattr(self.backend, "set_threads"):
            self.backend.set_threads(config.n_threads)
        self.source = FilledSource(MmapStore(weights.locations), weights.filled)
        self.exe = self.backend.compile(graph, self._plan(config), self.source,
                                        memory_reuse=bool(config.enable_memory_reuse))

    def _plan(self, config: SessionConfig) -> Any:
        try:
            from uaii.planner import PlannerOptions, plan
        except ImportError:  # the planner is optional: the backend then follows the graph's order
            return None
        options = PlannerOptions(enable_fusion=bool(config.enable_fusion),
                                 enable_memory_reuse=bool(config.enable_memory_reuse),
                                 budget_bytes=config.budget_bytes, device=self.backend.name)
        return plan(self.graph, options, cache=False)[0]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.exe.input_names)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise CapiError(Status.ERR_INVALID_ARGUMENT, f"input(s) {', '.join(missing)} not set; the graph takes "
                                                         f"{', '.join(self.input_names)}")
        return {k: np.array(v) for k, v in self.exe.run(dict(feeds)).items()}

    def weight(self, name: str) -> np.ndarray | None:
        t = self.graph.tensor_map.get(name)
        if t is None or not t.is_weight:
            return None
        if t.is_constant:
            return t.numpy()
        return np.asarray(self.source.acquire(str(t.weight) if t.weight is not None else t.name))

    def close(self) -> None:
        self.exe.close()
        self.source.close()

