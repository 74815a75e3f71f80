"""Memory presets: a named memory budget plus the KV cache that goes with it.

| preset        | budget                    | kv_window | kv_sinks | kv_dtype |
|---------------|---------------------------|-----------|----------|----------|
| `tiny`        | 256 MiB                   | 2048      | 4        | f16      |
| `laptop`      | 2 GiB                     | 2048      | 4        | f16      |
| `workstation` | 16 GiB                    | 2048      | 4        | f16      |
| `unlimited`   | 0 (no budget)             | 0 (all)   | 4        | f16      |
| `auto`        | 50 % of available (*)     | 2048      | 4        | f16      |

(*) available: MemAvailable, or, in a cgroup with a memory limit (a container, a systemd slice, ``memory.max``),
what the limit leaves if that is less (uaii.runtime.cgroup: the limit less the cgroup's unreclaimable usage; page
cache counts against a cgroup). Rounded down to a step of 1 GiB (above 4 GiB), 256 MiB (above 1 GiB) or 64 MiB,
so that it stays the same from run to run (the budget is part of the plan cache key); unlimited when neither can
be read.

The budget covers everything the process holds (pinned weights, staging buffers, KV cache, activations).
The window bounds the KV cache's memory, not the positions: generation still ends at the model's context, the same
in every preset, unless ``kv_positions="cache"`` lets the window slide past it (see uaii.runtime.bounds).
The KV cache is f16, as llama.cpp's default: half the bytes of f32, and decode reads it every token (SmolLM2
after a 512-token prompt: ~160 instead of ~120-140 tok/s); keys and values are rounded to f16, which moves logits
by a few hundredths to tenths. ``Session(...)`` without a preset keeps the exact f32 cache.
`auto` reads MemAvailable from /proc/meminfo and the process's cgroup limit when the preset is resolved. The CLI
applies `auto` unless told otherwise (``--preset``, ``--budget``); ``Session(...)`` in Python applies no preset
unless asked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from uaii.ir import UaiiError
from uaii.runtime.cgroup import cgroup_memory

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

DEFAULT_KV_WINDOW = 2048
DEFAULT_KV_SINKS = 4
DEFAULT_KV_DTYPE = "f16"  # as llama.cpp: half the bytes decode reads every token
AUTO_FRACTION = 0.5  # of the available memory (MemAvailable, or what a cgroup limit leaves)
DEFAULT_PRESET = "auto"  # what the CLI applies


class PresetError(UaiiError):
    """An unknown preset name or an unreadable byte size."""

    component = "preset"


@dataclass(frozen=True)
class Preset:
    """A memory budget in bytes (0 = unlimited) and the KV-cache window (0 = unbounded) plus attention sinks."""

    name: str
    budget_bytes: int
    kv_window: int = DEFAULT_KV_WINDOW
    kv_sinks: int = DEFAULT_KV_SINKS
    kv_dtype: str = DEFAULT_KV_DTYPE
    description: str = ""

    def session_options(self) -> dict[str, Any]:
        """The Session options this preset sets."""
        return {"preset": self.name, "budget_bytes": self.budget_bytes, "kv_window": self.kv_window,
                "kv_sinks": self.kv_sinks, "kv_dtype": self.kv_dtype}

    def with_budget(self, budget_bytes: int) -> Preset:
        """This preset with another budget (``--budget`` on the command line)."""
        return replace(self, budget_bytes=budget_bytes)

    def describe(self) -> str:
        """``auto (budget 11.2 GiB, kv window 2048 f16)`` — what the stats line shows."""
        budget = format_bytes(self.budget_bytes) if self.budget_bytes else "unlimited"
        window = str(self.kv_window) if self.kv_window else "unbounded"
        return f"{self.name} (budget {budget}, kv window {window} {self.kv_dtype})"


_FIXED = {
    "tiny": Preset("tiny", 256 * MiB, description="256 MiB: small boards, containers with tight limits"),
    "laptop": Preset("laptop", 2 * GiB, description="2 GiB: a laptop that keeps running other programs"),
    "workstation": Preset("workstation", 16 * GiB, description="16 GiB: a desktop or server"),
    "unlimited": Preset("unlimited", 0, kv_window=0, description="no budget, KV cache unbounded: map everything"),
}
PRESET_NAMES = ("tiny", "laptop", "workstation", "unlimited", "auto")


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """Bytes of MemAvailable (Linux), else free physical pages as the OS reports them, else 0."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * (KiB if len(parts) > 2 and parts[2].lower() == "kb" else 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return 0


def auto_budget(available: int) -> int:
    """``AUTO_FRACTION`` of ``available`` bytes, rounded down to a coarse step (1 GiB above 4 GiB, 256 MiB above
    1 GiB, else 64 MiB) so that the budget — part of the plan cache key — stays the same from run to run while
    MemAvailable moves a little."""
    raw = int(available * AUTO_FRACTION)
    step = GiB if raw >= 4 * GiB else 256 * MiB if raw >= GiB else 64 * MiB
    return max(raw // step * step, min(raw, 64 * MiB))


def get_preset(name: str, *, meminfo: str = "/proc/meminfo", proc: str = "/proc/self") -> Preset:
    """The preset called ``name``; ``auto`` is computed now from MemAvailable and, where the process's cgroup has
    a memory limit, what that limit leaves (the smaller; unlimited when neither is known). ``proc``: the /proc
    entry whose cgroup counts (tests point it at a fake tree)."""
    key = name.strip().lower()
    if key in _FIXED:
        return _FIXED[key]
    if key == "auto":
        avail = mem_available(meminfo)
        source = f"MemAvailable {format_bytes(avail)}" if avail else "MemAvailable unknown"
        group = cgroup_memory(proc)
        if group is not None and (not avail or group.available < avail):
            avail = group.available
            source = (f"cgroup v{group.version} limit {format_bytes(group.limit)}, {format_bytes(avail)} of it "
                      f"free")
        # a cgroup with nothing left still gets a budget: 0 would mean unlimited, the one wrong answer there
        budget = auto_budget(avail) if avail else (64 * MiB if group is not None else 0)
        return Preset("auto", budget, description=f"{AUTO_FRACTION:.0%} of available memory ({source})")
    raise PresetError(f"unknown preset {name!r}; known: {', '.join(PRESET_NAMES)}")


def presets(*, meminfo: str = "/proc/meminfo", proc: str = "/proc/self") -> list[Preset]:
    """Every preset, ``auto`` resolved on this machine."""
    return [get_preset(n, meminfo=meminfo, proc=proc) for n in PRESET_NAMES]


def resolve(preset: str | None = None, budget: str | int | None = None) -> Preset:
    """What the CLI runs with: ``preset`` (default ``auto``), its budget replaced by ``budget`` when given."""
    chosen = get_preset(preset or DEFAULT_PRESET)
    if budget is not None:
        chosen = chosen.with_budget(parse_bytes(budget))
    return chosen


# --------------------------------------------------------------------------------------------------- byte sizes
_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kib": KiB, "kb": 1000,
    "m": MiB, "mib": MiB, "mb": 1000**2,
    "g": GiB, "gib": GiB, "gb": 1000**3,
    "t": TiB, "tib": TiB, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Bytes of ``"256MiB"``, ``"2GB"``, ``"1.5G"``, ``"1048576"`` or an int.

    KiB/MiB/GiB/TiB and the bare K/M/G/T are powers of 1024; kB/MB/GB/TB are powers of 1000; case is ignored.
    """
    if isinstance(text, bool):
        raise PresetError(f"a byte size must be a number with an optional unit, found {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise PresetError(f"a byte size must be >= 0, found {text}")
        return text
    m = _SIZE.match(str(text))
    if m is None:
        raise PresetError(f"cannot read {text!r} as a byte size; expected e.g. 256MiB, 2GB, 1.5G or 1048576")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise PresetError(f"unknown unit {m.group(2)!r} in {text!r}; use B, KiB, MiB, GiB, TiB (1024) or kB, MB, "
                          "GB, TB (1000)")
    if "." not in number:
        return int(number) * _UNITS[unit]
    return round(float(number) * _UNITS[unit])


def format_bytes(n: int | float) -> str:
    """``512 B``, ``1.5 GiB``, ``227 MiB`` (three significant digits at most above 1 KiB)."""
    value = float(n)
    if abs(value) < KiB:
        return f"{int(value)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"


__all__ = ["AUTO_FRACTION", "DEFAULT_KV_SINKS", "DEFAULT_KV_WINDOW", "DEFAULT_PRESET", "PRESET_NAMES", "Preset",
           "PresetError", "auto_budget", "format_bytes", "get_preset", "mem_available", "parse_bytes", "presets",
           "resolve"]
