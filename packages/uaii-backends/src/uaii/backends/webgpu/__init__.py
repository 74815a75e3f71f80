"""uaii.backends.webgpu — UAII's GPU backend on WebGPU (wgpu: Vulkan, Metal, D3D12; lavapipe for tests).

Install with ``pip install 'uaii-backends[webgpu]'``. See device.py for the adapter policy, executable.py for how a
graph runs, program.py for the kernel conventions, ops/ for the WGSL kernels.
"""

from uaii.backends.webgpu.backend import WebGpuBackend
from uaii.backends.webgpu.device import ALLOW_SOFTWARE_ENV, AdapterInfo, adapters

__all__ = ["ALLOW_SOFTWARE_ENV", "AdapterInfo", "WebGpuBackend", "adapters"]
