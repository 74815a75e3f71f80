"""IR graphs opened through the C API: weight references resolved with ``weights_dir`` / ``weights_sandbox``, and
missing weights failing closed or filled per ``weight_init``.

``uaii.runtime.Session(path)`` resolves an IR file's weight references against the file's own directory (which is
also its sandbox). When the C options ask for nothing else and every weight resolves, the adapter opens the file
that way; otherwise it resolves the references here and hands the Session a bundle
(``uaii.runtime.model.ir_bundle``) whose location index says where each weight really is, the filled ones
included (:class:`FilledFile`). Either way one Session runs the graph, so generation, ``run`` and streaming under a
budget behave the same whether the weights moved or not.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from uaii.capi.options import SessionConfig, WeightInit
from uaii.capi.status import CapiError, Status
from uaii.ir import DType, Graph, Tensor, WeightRef, is_symbolic

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

    locations: dict[str, Any] = field(default_factory=dict)  # weight key -> storage location (filled ones too)
    session_compatible: bool = True  # Session(path) would resolve every reference the same way
    warnings: list[str] = field(default_factory=list)
    filled_file: FilledFile | None = None  # where the filled values are read from; open as long as the session

    def close(self) -> None:
        if self.filled_file is not None:
            self.filled_file.close()
            self.filled_file = None


def _container(path: Path) -> Mapping[str, Any]:
    """Tensor table (name -> location) of a GGUF or safetensors file, as the Session reads it."""
    from uaii.runtime import weight_container

    table = weight_container(path)
    if table is None:
        raise CapiError(Status.ERR_INVALID_ARGUMENT, f"{path}: weight container format not recognized "
                                                     "(expected GGUF or safetensors)")
    return table


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
    from uaii.backends import weight_key  # the key the backend acquires each weight by

    ir_dir = ir_path.resolve().parent
    base = Path(config.weights_dir).resolve() if config.weights_dir else ir_dir
    sandbox = config.weights_sandbox
    out = ResolvedWeights(session_compatible=(base == ir_dir and sandbox in (None, "")))
    containers: dict[Path, Mapping[str, Any]] = {}
    filled: dict[str, tuple[DType, np.ndarray]] = {}
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
        filled[weight_key(t)] = (t.dtype, fill(t, config.weight_init))
        out.warnings.append(f"weight {t.name!r} is missing ({where}); filled with "
                            f"{WeightInit(config.weight_init).name.lower()}")
    if filled:
        out.filled_file = FilledFile(filled)
        out.locations.update(out.filled_file.locations)
    return out


class FilledFile:
    """The filled weights written into one anonymous file, each at its own location.

    ``uaii.runtime.Session`` and the stores it builds (memory-mapped or streaming, under a budget) read weights
    only through file locations; giving filled values a file lets them take exactly the path real weights take,
    with nothing in the runtime special-cased. A memfd lives in memory and disappears with the process, so an
    embedding program that never destroys its session leaves nothing behind; where there is no memfd an ordinary
    temporary file is used and removed by :meth:`close`.
    """

    ALIGN = 64

    def __init__(self, arrays: Mapping[str, tuple[DType, np.ndarray]]) -> None:
        from uaii.storage import WeightLocation

        self._unlink: str | None = None
        if hasattr(os, "memfd_create"):
            self._fd = os.memfd_create("uaii-filled-weights", getattr(os, "MFD_CLOEXEC", 0))
            self.path = f"/proc/self/fd/{self._fd}"
        else:  # pragma: no cover - non-Linux
            self._fd, self.path = tempfile.mkstemp(prefix="uaii-filled-", suffix=".bin")
            self._unlink = self.path
        self.locations: dict[str, Any] = {}
        try:
            offset = 0
            for key, (dtype, arr) in arrays.items():
                data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
                done = 0
                while done < len(data):  # one write call may take less than asked (about 2 GiB at most)
                    done += os.pwrite(self._fd, data[done:], offset + done)
                self.locations[key] = WeightLocation(self.path, offset, len(data), dtype,
                                                     tuple(int(d) for d in arr.shape))
                offset += -(-max(len(data), 1) // self.ALIGN) * self.ALIGN
            os.ftruncate(self._fd, max(offset, 1))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._unlink is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._unlink)
            self._unlink = None
