"""The CPU backend: graphs executed with the C kernels of uaii-kernels (numpy for the rest)."""

from uaii.backends.cpu.backend import CpuBackend
from uaii.backends.cpu.executable import CpuExecutable
from uaii.backends.cpu.kv import KVCacheFull, KVState

__all__ = ["CpuBackend", "CpuExecutable", "KVCacheFull", "KVState"]
