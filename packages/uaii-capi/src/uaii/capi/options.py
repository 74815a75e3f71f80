"""Python views of the C API's structs: session options, generation parameters and generation statistics.

Field names match uaii/c_api/uaii.h exactly (the C marshalling copies them by name); defaults match
``uaii_session_options_init`` / ``uaii_generate_params_init`` in csrc/uaii_capi.c.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from uaii.capi.status import invalid


class WeightInit(enum.IntEnum):
    NONE = 0
    ZEROS = 1
    ONES = 2
    SEQUENCE = 3


class ComputeDType(enum.IntEnum):
    F32 = 0
    F16 = 1


class FinishReason(enum.IntEnum):
    NONE = 0
    LENGTH = 1
    STOP = 2
    EOS = 3
    CALLBACK = 4
    CONTEXT = 5


@dataclass(frozen=True)
class SessionConfig:
    """``uaii_session_options`` after the caller's struct_size bytes were laid over the defaults."""

    backend: str | None = "cpu"
    weights_dir: str | None = None
    weight_init: int = WeightInit.NONE
    enable_fusion: int = 1
    enable_memory_reuse: int = 1
    enable_profiler: int = 0
    profile_trace_path: str | None = None
    budget_bytes: int = 0
    enable_streaming: int = 0
    allow_missing_weights: int = 0
    weights_sandbox: str | None = None
    compute_dtype: int = ComputeDType.F32
    keep_quantized_weights: int = 1
    max_context: int = 0
    kv_window: int = 0
    kv_sinks: int = 4
    pin_layers: int = -1
    n_threads: int = 0
    preset: str | None = None
    kv_positions: str | None = None
    kv_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.weight_init not in WeightInit.__members__.values():
            raise invalid(f"weight_init must be one of {[int(v) for v in WeightInit]}, found {self.weight_init}")
        if self.compute_dtype not in ComputeDType.__members__.values():
            raise invalid(f"compute_dtype must be one of {[int(v) for v in ComputeDType]}, "
                          f"found {self.compute_dtype}")
        for name in ("max_context", "kv_window", "kv_sinks", "n_threads", "budget_bytes"):
            if getattr(self, name) < 0:
                raise invalid(f"{name} must be >= 0, found {getattr(self, name)}")
        if self.pin_layers < -1:
            raise invalid(f"pin_layers must be >= 0 or -1 (the runtime's choice), found {self.pin_layers}")

    @property
    def device(self) -> str:
        return self.backend or "cpu"


@dataclass(frozen=True)
class GenerateConfig:
    """``uaii_generate_params`` (the callback and its user data stay on the C side)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = -1
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise invalid(f"max_new_tokens must be >= 0, found {self.max_new_tokens}")
        checks = [("temperature", self.temperature >= 0.0), ("top_k", self.top_k >= 0),
                  ("top_p", 0.0 < self.top_p <= 1.0), ("min_p", 0.0 <= self.min_p <= 1.0),
                  ("repetition_penalty", self.repetition_penalty > 0.0)]
        for name, ok in checks:
            if not ok:
                raise invalid(f"{name} out of range: {getattr(self, name)}")
        if any(s == "" for s in self.stop_strings):
            raise invalid("stop_strings must not contain an empty string")


@dataclass
class GenerationStats:
    """``uaii_generation_stats``."""

    finish_reason: int = FinishReason.NONE
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cached_prompt_tokens: int = 0
    ttft_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_tokens_per_second: float = 0.0
    decode_tokens_per_second: float = 0.0
    bytes_read: int = 0
    bytes_read_per_token: float = 0.0
    peak_rss_bytes: int = 0
    load_seconds: float = 0.0


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
