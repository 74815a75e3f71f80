"""What a Session reports: its lifecycle state, generation results and their statistics."""

from __future__ import annotations

import enum
import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import Any


class SessionState(enum.Enum):
    """CREATED → LOADED → PLANNED → READY → CLOSED."""

    CREATED = "created"
    LOADED = "loaded"
    PLANNED = "planned"
    READY = "ready"
    CLOSED = "closed"


@dataclass
class GenerationStats:
    """Timings and counters of one generation. Rates are tokens per second (0 when nothing was timed)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    ttft_s: float = 0.0  # prompt submitted → first new token sampled
    prefill_s: float = 0.0
    prefill_tok_s: float = 0.0
    decode_s: float = 0.0
    decode_tok_s: float = 0.0  # tokens after the first, over decode_s
    peak_rss_bytes: int = 0
    load_s: float = 0.0
    plan_cache_hit: bool = False
    bytes_read_per_token: float = 0.0  # weight bytes a decode step reads (mapped or streamed)
    cached_tokens: int = 0  # prompt tokens served from the KV cache (a continued conversation)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    prompt_tokens: list[int]
    # "length": max_new_tokens, or the context (see uaii.runtime.bounds); "eos": an end-of-generation id;
    # "stop": a stop id or string, on_token, a stream closed early, or an exception (KeyboardInterrupt) that ended it
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": list(self.tokens), "prompt_tokens": list(self.prompt_tokens),
                "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class ModelInfo:
    """What was loaded: architecture, normalized config, parameter count and the tensor table."""

    arch: str
    path: str
    format: str
    config: dict[str, Any]
    n_params: int
    tensors: list[dict[str, Any]]
    graph_nodes: int
    weight_bytes: int

    @property
    def architecture(self) -> str:
        return self.arch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_rss_bytes() -> int:
    """The process's peak resident set: VmHWM from /proc/self/status, else getrusage's ru_maxrss."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


__all__ = ["GenerationResult", "GenerationStats", "ModelInfo", "SessionState", "peak_rss_bytes"]
