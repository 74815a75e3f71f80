"""Fixtures of the backend tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def small_device() -> Any:
    """A WebGPU device (software adapters allowed) whose storage bindings are capped at 64 KiB, so that modest
    weights and tables split into row shards. Skips without wgpu or an adapter."""
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    from uaii.backends.base import BackendUnavailable
    from uaii.backends.webgpu.device import MAX_BINDING_ENV, GpuDevice, choose

    try:
        info, adapter = choose(True)
    except BackendUnavailable as exc:
        pytest.skip(f"no WebGPU adapter: {exc.reason}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MAX_BINDING_ENV, str(64 * 1024))
        return GpuDevice(info, adapter)


@pytest.fixture(params=["host", "compiled", "cuda"])
def cuda_dev(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Where the CUDA kernel tests launch: the host model running the kernels' CPU references; the host model
    running every kernel's CUDA source built by the host compiler (host_kernels.py: warp- and block-level kernels
    with a thread per CUDA thread); a CUDA device where there is one (else skipped "no CUDA device")."""
    from uaii.backends.cuda.device import first_device
    from uaii.backends.cuda.host import HostDevice

    d = {"host": HostDevice, "compiled": lambda: HostDevice(kernels="all"), "cuda": first_device}[request.param]()
    if d is None:
        pytest.skip("no CUDA device")
    yield d
    d.close()
