"""uaii.runtime — the Session (load → plan → execute), generation, KV cache, sampling, memory presets, the CLI.

    from uaii.runtime import Session
    with Session("model.gguf") as s:
        result = s.generate("Hello", max_new_tokens=32)
        print(result.text, result.stats.decode_tok_s)

See packages/uaii-runtime/README.md and docs/runtime.md.

The names below are imported on first use (PEP 562), not when the package is: the ``uaii`` command imports this
package before its own code runs, and with eager imports the second it spends importing numpy and the kernels
would be outside the CLI's Ctrl-C handler (a traceback instead of ``interrupted``, exit 130).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# exported name -> the module of uaii.runtime that defines it
_EXPORTS = {
    "SessionError": "errors",
    "ModelBundle": "model", "ir_bundle": "model", "weight_container": "model",
    "SessionOptions": "options",
    "GenerationResult": "results", "GenerationStats": "results", "ModelInfo": "results", "SessionState": "results",
    "peak_rss_bytes": "results",
    "Session": "session", "Sequence": "sequences",
    # the continuous-batching engine behind `uaii serve` (no web framework imported)
    "Engine": "engine", "EngineError": "engine", "Event": "engine", "GenRequest": "engine", "Handle": "engine",
    "Usage": "engine",
    # sampling and memory presets (the `uaii` CLI is uaii.runtime.cli)
    "PRESET_NAMES": "presets", "Preset": "presets", "PresetError": "presets", "get_preset": "presets",
    "parse_bytes": "presets",
    "Sampler": "sampling", "SamplingError": "sampling", "SamplingParams": "sampling",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("uaii-runtime")
    elif name in _EXPORTS:
        value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from uaii.runtime.engine import Engine, EngineError, Event, GenRequest, Handle, Usage
    from uaii.runtime.errors import SessionError
    from uaii.runtime.model import ModelBundle, ir_bundle, weight_container
    from uaii.runtime.options import SessionOptions
    from uaii.runtime.presets import PRESET_NAMES, Preset, PresetError, get_preset, parse_bytes
    from uaii.runtime.results import GenerationResult, GenerationStats, ModelInfo, SessionState, peak_rss_bytes
    from uaii.runtime.sampling import Sampler, SamplingError, SamplingParams
    from uaii.runtime.sequences import Sequence
    from uaii.runtime.session import Session

    __version__: str

__all__ = ["PRESET_NAMES", "Engine", "EngineError", "Event", "GenRequest", "GenerationResult", "GenerationStats",
           "Handle", "ModelBundle", "ModelInfo", "Preset", "PresetError", "Sampler", "SamplingError", "SamplingParams",
           "Sequence", "Session", "SessionError", "SessionOptions", "SessionState", "Usage", "__version__",
           "get_preset", "ir_bundle", "parse_bytes", "peak_rss_bytes", "weight_container"]
