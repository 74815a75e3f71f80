"""Fixtures of the backend tests."""

from __future__ import annotations

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
