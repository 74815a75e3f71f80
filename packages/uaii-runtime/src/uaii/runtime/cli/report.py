"""Formatting shared by the commands: the stats line, the ``--json`` objects, numbers for humans."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from uaii.runtime.presets import Preset, format_bytes


def stat(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` for a stats object or a dict, else ``default``."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def stats_dict(stats: Any) -> dict[str, Any]:
    if stats is None:
        return {}
    if hasattr(stats, "to_dict"):
        return dict(stats.to_dict())
    if isinstance(stats, dict):
        return dict(stats)
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}


def rate(value: Any) -> str:
    """``142.3 tok/s``; ``-`` when unknown."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{float(value):.1f} tok/s"


def seconds(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def size(value: Any) -> str:
    return "-" if not value else format_bytes(int(value))


def stats_line(stats: Any, preset: Preset | None = None, finish_reason: str | None = None) -> str:
    """One line: prompt tokens, new tokens, ttft, prefill and decode tok/s, peak RSS, preset."""
    parts = [
        f"prompt {stat(stats, 'prompt_tokens', 0)} tok",
        f"new {stat(stats, 'new_tokens', 0)} tok" + (f" ({finish_reason})" if finish_reason else ""),
        f"ttft {seconds(stat(stats, 'ttft_s'))}",
        f"prefill {rate(stat(stats, 'prefill_tok_s'))}",
        f"decode {rate(stat(stats, 'decode_tok_s'))}",
        f"peak RSS {size(stat(stats, 'peak_rss_bytes'))}",
    ]
    if preset is not None:
        parts.append(f"preset {preset.describe()}")
    return " · ".join(parts)


def result_json(result: Any, preset: Preset | None = None, **extra: Any) -> dict[str, Any]:
    """The ``uaii run --json`` object: the fields of the contract first, then the full stats and the extras."""
    stats = stats_dict(result.stats)
    obj: dict[str, Any] = {
        "text": result.text,
        "tokens": [int(t) for t in result.tokens],
        "prompt_tokens": [int(t) for t in result.prompt_tokens],
        "prefill_tok_s": stats.get("prefill_tok_s"),
        "decode_tok_s": stats.get("decode_tok_s"),
        "ttft_s": stats.get("ttft_s"),
        "peak_rss_bytes": stats.get("peak_rss_bytes"),
        "finish_reason": result.finish_reason,
        "stats": stats,
    }
    if preset is not None:
        obj["preset"] = {"name": preset.name, "budget_bytes": preset.budget_bytes, "kv_window": preset.kv_window,
                         "kv_sinks": preset.kv_sinks}
    obj.update(extra)
    return obj


def print_json(obj: Any) -> None:
    """One JSON document on stdout (plain print: never wrapped or colored by rich)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


__all__ = ["print_json", "rate", "result_json", "seconds", "size", "stat", "stats_dict", "stats_line"]
