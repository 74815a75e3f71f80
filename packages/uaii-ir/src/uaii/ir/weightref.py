"""Weight references: how the IR points at weights without ever holding them.

Three forms, all plain strings in files:

* ``path#tensor`` — a named tensor inside a container file (GGUF, safetensors, ...);
* ``path#tensor#e=N`` — expert N (outermost dimension) of a packed expert bank inside a container;
* ``path`` — a raw little-endian file holding exactly that tensor (as the C++ runtime writes them).

``#e=N`` names experts only. Rows of a tensor (an embedding row, a chunk of an lm_head) are not a reference form
of the IR: a reader asks the storage layer for them as ``ref@rows=A:B`` (``uaii.storage.rows_ref``), whatever the
reference's form, raw files included.

Relative paths resolve against the model directory. A sandbox root, when given, confines resolution: absolute
paths, ``..`` components and symlinks that lead out are rejected rather than silently followed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from uaii.ir.errors import WeightRefError

_EXPERT_SUFFIX = re.compile(r"#e=(0|[1-9][0-9]*)$")


@dataclass(frozen=True, slots=True)
class WeightRef:
    """A parsed weight reference. ``tensor`` is None for raw files; ``expert`` is set only inside a bank."""

    path: str
    tensor: str | None = None
    expert: int | None = None

    def __post_init__(self) -> None:
        if not self.path:
            raise WeightRefError("weight reference has an empty path")
        if "#" in self.path:
            raise WeightRefError(f"weight reference path {self.path!r} must not contain '#'")
        if "\x00" in self.path or (self.tensor is not None and "\x00" in self.tensor):
            raise WeightRefError("weight reference contains a NUL character")
        if self.tensor is not None and not self.tensor:
            raise WeightRefError(f"weight reference {self.path!r}# names an empty tensor")
        if self.expert is not None:
            if self.tensor is None:
                raise WeightRefError(f"expert index on {self.path!r} needs a tensor name")
            if self.expert < 0:
                raise WeightRefError(f"expert index must be >= 0, found {self.expert}")

    @classmethod
    def parse(cls, text: str) -> WeightRef:
        """Parse the string form; the inverse of ``str()``."""
        if not isinstance(text, str) or not text:
            raise WeightRefError(f"weight reference must be a non-empty string, found {text!r}")
        path, sep, rest = text.partition("#")
        if not sep:
            return cls(path)
        expert = None
        m = _EXPERT_SUFFIX.search(rest)
        if m is not None:
            expert = int(m.group(1))
            rest = rest[: m.start()]
        elif re.search(r"#e=", rest):
            raise WeightRefError(f"weight reference {text!r}: expert suffix must be '#e=N' with N a decimal index")
        return cls(path, rest, expert)

    def __str__(self) -> str:
        s = self.path
        if self.tensor is not None:
            s += "#" + self.tensor
        if self.expert is not None:
            s += f"#e={self.expert}"
        return s

    @property
    def is_raw_file(self) -> bool:
        return self.tensor is None

    def with_expert(self, expert: int) -> WeightRef:
        return WeightRef(self.path, self.tensor, expert)

    def resolve(self, base_dir: str | os.PathLike[str] | None = None,
                sandbox: str | os.PathLike[str] | None = None) -> Path:
        """The absolute file path this reference names.

        With a sandbox, the reference must be relative, free of ``..`` and, after following symlinks, inside
        the sandbox directory.
        """
        raw = Path(self.path)
        if sandbox is not None:
            if raw.is_absolute():
                raise WeightRefError(f"weight reference {str(self)!r} is absolute; the sandbox {sandbox} "
                                     "only admits relative paths")
            if ".." in raw.parts:
                raise WeightRefError(f"weight reference {str(self)!r} contains '..' and would escape "
                                     f"the sandbox {sandbox}")
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        full = raw if raw.is_absolute() else base / raw
        full = Path(os.path.abspath(full))
        if sandbox is not None:
            root = Path(os.path.realpath(sandbox))
            real = Path(os.path.realpath(full))
            if real != root and root not in real.parents:
                raise WeightRefError(f"weight reference {str(self)!r} resolves to {real}, outside the "
                                     f"sandbox {root}")
            return real
        return full
