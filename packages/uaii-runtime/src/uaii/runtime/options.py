"""Session options: one frozen dataclass, checked when a Session is created.

Defaults are the DESIGN's for the Python API: CPU, an unbounded KV cache (``kv_window = 0``), no memory budget and
no preset. The CLI applies a memory preset itself (uaii.runtime.presets) and passes its fields here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from uaii.backends.config import GEMM_MODES
from uaii.runtime.errors import SessionError

log = logging.getLogger("uaii.runtime")

KV_DTYPES = ("f32", "f16")
KV_POSITIONS = ("absolute", "cache")
PIPELINE_TRANSPORTS = ("ray", "local")
# options of the pipeline's driver, never passed on to its stages
PIPELINE_OPTIONS = ("pipeline", "pipeline_starts", "pipeline_transport", "ray_address", "stage_timeout_s")


@dataclass(frozen=True)
class SessionOptions:
    """What a Session runs with.

    device: backend name or ``"auto"`` (the first available GPU backend, else the CPU, reported).
    n_threads: kernel threads (None: ``$UAII_NUM_THREADS`` or the usable cores). At most the cores this process
        may run on (``os.sched_getaffinity``): a larger number, given here or in ``$UAII_NUM_THREADS``, is capped
        with a warning, because the kernel pool's threads would only wait for each other.
    max_context: tokens the KV cache holds (0: the model's context length).
    kv_window / kv_sinks: a resident window of that many recent tokens plus ``kv_sinks`` attention sinks
        (0: keep every token).
    kv_dtype: element type of the KV cache, ``"f32"`` (default) or ``"f16"`` (half the bytes; keys and values are
        rounded to half precision when cached, attention still computes in float32).
    kv_positions: the rotary positions of a windowed cache: ``"absolute"`` (default; each token keeps its position
        in the sequence) or ``"cache"`` (StreamingLLM: a token's position is its slot in the cache, so the model
        never sees distances beyond the window). Same result without a window; ``"cache"`` needs RoPE models.
    budget_bytes: memory budget for the storage plan (0: none; weights are memory-mapped).
    sequences: KV states of sequences (``new_sequence``, a server's requests) the budget keeps room for beside the
        session's own: the plan is made for the budget less their bytes at capacity, halving the count while even
        the smallest plan does not fit (warned). 0: none. Without a budget it changes nothing.
    gpu_budget_bytes: device-memory budget of a backend with device memory (WebGPU): the weights that do not fit
        stream from the host store before each use (0: 80 % of the device memory it reports; see
        uaii.runtime.gpu_budget).
    preset: a memory preset name (uaii.runtime.presets); its budget and window fill the options left at default.
    pin_layers: trunk layers to pin when a budget applies (None: the planner's default).
    expert_cache_bytes: bytes of the MoE expert LRU cache under a budget (part of the budget; 0: what the budget
        leaves once the dense weights are pinned, at least one expert of every bank; see uaii.planner.storage).
    stream_read_ahead: streamed tensors read ahead of compute (the store's ``max_inflight``).
    enable_fusion / enable_memory_reuse: planner fusion passes / arena reuse.
    max_batch: tokens per prefill step (the prompt runs in chunks of this many).
    plan_cache: use the on-disk plan cache.
    pipeline: run the decoder's layers as this many stages, each on its own node with its own memory budget (0 or
        1: in this process, no pipeline; see uaii.runtime.pipeline). Each stage resolves the other options on its
        node: ``budget_bytes`` and ``preset`` are each stage's budget there.
    pipeline_starts: the layers where stages 1 .. pipeline - 1 begin (empty: chosen from the stages' budgets).
    pipeline_transport: ``"ray"`` (one Ray actor per node, a STRICT_SPREAD placement group) or ``"local"`` (every
        stage in this process: a split checked on one machine).
    ray_address: the Ray cluster to join when this process is not connected to one (None: Ray's own default).
    stage_timeout_s: the longest a pipeline call may wait on a stage before the stage counts as lost.
    gemm: how the CPU (and the cuda backend) multiplies block-quantized weights: ``"fast"`` (int8 dot products
        over 8-bit quantized activations, as llama.cpp; on the CPU 16-bit activations for the output projection
        where the weight type has that kernel, Q8_0 today; see docs/kernels.md for its accuracy) or ``"f32"``
        (dequantized weights and float32 dots: the exact result, slower). None: ``$UAII_CPU_GEMM`` on the CPU,
        else fast.
    """

    device: str = "cpu"
    n_threads: int | None = None
    max_context: int = 0
    kv_window: int = 0
    kv_sinks: int = 4
    kv_dtype: str = "f32"
    kv_positions: str = "absolute"
    budget_bytes: int = 0
    sequences: int = 0
    gpu_budget_bytes: int = 0
    preset: str | None = None
    pin_layers: int | None = None
    expert_cache_bytes: int = 0
    stream_read_ahead: int = 8
    enable_fusion: bool = True
    enable_memory_reuse: bool = True
    max_batch: int = 512
    plan_cache: bool = True
    gemm: str | None = None
    pipeline: int = 0
    pipeline_starts: tuple[int, ...] = ()
    pipeline_transport: str = "ray"
    ray_address: str | None = None
    stage_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.device, str) or not self.device:
            raise SessionError(f"option device must be a backend name or 'auto', found {self.device!r}")
        if self.n_threads is not None:
            _int("n_threads", self.n_threads, 1)
        object.__setattr__(self, "n_threads", capped_threads(self.n_threads))
        for name, lo in (("max_context", 0), ("kv_window", 0), ("kv_sinks", 0), ("budget_bytes", 0), ("sequences", 0),
                         ("gpu_budget_bytes", 0), ("max_batch", 1), ("expert_cache_bytes", 0),
                         ("stream_read_ahead", 1)):
            _int(name, getattr(self, name), lo)
        if self.pin_layers is not None:
            _int("pin_layers", self.pin_layers, 0)
        if self.kv_dtype not in KV_DTYPES:
            raise SessionError(f"option kv_dtype must be one of {', '.join(KV_DTYPES)}, found {self.kv_dtype!r}")
        if self.kv_positions not in KV_POSITIONS:
            raise SessionError(f"option kv_positions must be one of {', '.join(map(repr, KV_POSITIONS))} "
                               f"(cache: StreamingLLM positions within the cache), found {self.kv_positions!r}")
        if self.gemm is not None and self.gemm not in GEMM_MODES:
            raise SessionError(f"option gemm must be one of {', '.join(GEMM_MODES)} (or None: $UAII_CPU_GEMM), "
                               f"found {self.gemm!r}")
        for name in ("enable_fusion", "enable_memory_reuse", "plan_cache"):
            if not isinstance(getattr(self, name), bool):
                raise SessionError(f"option {name} must be True or False, found {getattr(self, name)!r}")
        _int("pipeline", self.pipeline, 0)
        starts = self.pipeline_starts
        if not isinstance(starts, tuple | list) or any(isinstance(x, bool) or not isinstance(x, int) for x in starts):
            raise SessionError(f"option pipeline_starts must be a sequence of layer numbers, found {starts!r}")
        object.__setattr__(self, "pipeline_starts", tuple(starts))
        if starts and len(starts) != self.pipeline - 1:
            raise SessionError(f"option pipeline_starts gives {len(starts)} stage starts; {self.pipeline} stages "
                               f"need {max(self.pipeline - 1, 0)}")
        if self.pipeline_transport not in PIPELINE_TRANSPORTS:
            raise SessionError(f"option pipeline_transport must be one of {', '.join(PIPELINE_TRANSPORTS)}, found "
                               f"{self.pipeline_transport!r}")
        if isinstance(self.stage_timeout_s, bool) or not isinstance(self.stage_timeout_s, int | float) \
                or not self.stage_timeout_s > 0:
            raise SessionError(f"option stage_timeout_s must be a number of seconds > 0, "
                               f"found {self.stage_timeout_s!r}")
        if self.preset is not None and not isinstance(self.preset, str):
            raise SessionError(f"option preset must be a preset name, found {self.preset!r}")

    @classmethod
    def from_kwargs(cls, options: Mapping[str, Any]) -> SessionOptions:
        """Options from keyword arguments; an unknown name is an error that lists the valid ones."""
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise SessionError(f"unknown Session option(s) {', '.join(map(repr, unknown))}; valid options: "
                               f"{', '.join(valid)}")
        opts = cls(**options)
        return opts.with_preset(set(options)) if opts.preset else opts

    def with_preset(self, given: set[str]) -> SessionOptions:
        """Fill budget_bytes, kv_window, kv_sinks and kv_dtype from the preset where the caller did not set them."""
        from uaii.runtime.presets import get_preset

        assert self.preset is not None
        values = get_preset(self.preset).session_options()
        kw = {k: v for k, v in values.items() if k not in given and k != "preset"}
        return type(self)(**{**asdict(self), **kw})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def backend_options(self, accepted: Collection[str]) -> dict[str, Any]:
        """The backend-specific options of ``compile`` set here, among those the backend declares it understands
        (``accepted``: its ``Capabilities.compile_options``). Only those set: the CPU backend's own default for
        ``gemm`` is ``$UAII_CPU_GEMM``. The Session refuses a set option the backend does not declare
        (:func:`uaii.runtime.capabilities.check_backend`) before it gets here."""
        return {k: v for k, v in self.backend_specific().items() if k in accepted}

    def backend_specific(self) -> dict[str, Any]:
        """The options set here that only some backends understand (names of ``Capabilities.compile_options``)."""
        return {"gemm": self.gemm} if self.gemm is not None else {}


def capped_threads(n_threads: int | None) -> int | None:
    """``n_threads``, or the usable cores when it (or ``$UAII_NUM_THREADS`` for None) asks for more; a warning
    says so once per Session. None stays None when the environment asks for no more than the cores."""
    from uaii.kernels.config import NUM_THREADS_ENV, usable_cores

    asked, where = n_threads, f"n_threads={n_threads}"
    if asked is None:
        raw = os.environ.get(NUM_THREADS_ENV, "").strip()
        asked, where = (int(raw), f"{NUM_THREADS_ENV}={raw}") if raw.isdigit() else (None, "")
    cores = usable_cores()
    if asked is None or asked <= cores:
        return n_threads
    log.warning("[runtime] %s is more than the %d core%s this process may run on (os.sched_getaffinity); using "
                "%d threads: more threads than cores only wait for each other", where, cores,
                "s" if cores != 1 else "", cores)
    return cores


def _int(name: str, value: Any, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise SessionError(f"option {name} must be an int >= {lo}, found {value!r}")


__all__ = ["PIPELINE_OPTIONS", "SessionOptions", "capped_threads"]
