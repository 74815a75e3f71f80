"""uaii.runtime — the Session (load → plan → execute), generation, KV cache, sampling, memory presets, the CLI.

    from uaii.runtime import Session
    with Session("model.gguf") as s:
        result = s.generate("Hello", max_new_tokens=32)
        print(result.text, result.stats.decode_tok_s)

See packages/uaii-runtime/README.md and docs/runtime.md.
"""

from importlib.metadata import version as _version

from uaii.runtime.errors import SessionError
from uaii.runtime.model import ModelBundle, ir_bundle, weight_container
from uaii.runtime.options import SessionOptions
from uaii.runtime.results import GenerationResult, GenerationStats, ModelInfo, SessionState, peak_rss_bytes
from uaii.runtime.session import Session

__version__ = _version("uaii-runtime")
__all__ = ["GenerationResult", "GenerationStats", "ModelBundle", "ModelInfo", "Session", "SessionError",
           "SessionOptions", "SessionState", "__version__", "ir_bundle", "peak_rss_bytes", "weight_container"]

# sampling and memory presets (the `uaii` CLI is uaii.runtime.cli, imported on demand)
from uaii.runtime.presets import PRESET_NAMES, Preset, PresetError, get_preset, parse_bytes
from uaii.runtime.sampling import Sampler, SamplingError, SamplingParams

__all__ += ["PRESET_NAMES", "Preset", "PresetError", "Sampler", "SamplingError", "SamplingParams", "get_preset",
            "parse_bytes"]
