"""Backends by name through the entry points, honest device probes, and device selection with a reported
fallback."""

from __future__ import annotations

import ctypes
import logging
from importlib.metadata import entry_points
from typing import Any

import numpy as np
import pytest

from uaii.backends import (
    BackendError,
    CpuBackend,
    DeviceStatus,
    backend_names,
    get_backend,
    gpu,
    list_backends,
    select_device,
)

GPU = ("cuda", "rocm", "metal", "vulkan", "webgpu")


def test_builtins_are_entry_points() -> None:
    names = {ep.name for ep in entry_points(group="uaii.backends")}
    assert {"cpu", *GPU} <= names
    assert backend_names()[:6] == ["cpu", *GPU]
    assert isinstance(get_backend("cpu"), CpuBackend) and get_backend("CPU") is get_backend("cpu")


def test_list_backends_covers_every_backend_with_a_status() -> None:
    listed = dict(list_backends())
    assert list(listed)[:6] == ["cpu", *GPU]
    assert listed["cpu"].available and listed["cpu"].devices[0].startswith("cpu:0")
    for name in GPU:
        status = listed[name]
        assert isinstance(status, DeviceStatus)
        assert status.available or status.reason, name  # never unavailable without saying why
        if name != "webgpu":  # webgpu executes (tests/backends/test_webgpu_device.py); the others are probes only
            assert not status.available
    assert "macOS" in listed["metal"].reason or listed["metal"].devices


def test_unknown_and_unavailable_devices_are_errors() -> None:
    with pytest.raises(BackendError, match=r"unknown backend 'tpu'.*registered: cpu"):
        get_backend("tpu")
    with pytest.raises(BackendError, match="device 'cuda' is not available: "):
        select_device("cuda")
    assert select_device("cpu").name == "cpu"


def test_auto_falls_back_to_cpu_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="uaii.backends"):
        backend = select_device("auto")
    assert backend.name == "cpu"
    text = caplog.text
    assert "falling back to cpu" in text and all(f"{name}:" in text for name in GPU)


class _Fn:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _set(ref: Any, value: int) -> None:
    ref._obj.value = value


class _FakeCuda:
    cuInit = _Fn(lambda flags: 0)
    cuDeviceGetCount = _Fn(lambda ref: _set(ref, 2) or 0)
    cuDeviceGet = _Fn(lambda ref, i: _set(ref, i) or 0)

    @staticmethod
    def _name(buf: Any, n: int, dev: Any) -> int:
        ctypes.memmove(buf, b"Fake GPU\0", 9)
        return 0

    cuDeviceGetName = _Fn(_name)


def test_cuda_devices_run_when_named_and_auto_passes_them_by(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The CUDA executor has not run on a GPU yet: a found device is available to ``--device cuda`` (with
    cuda-bindings installed), and ``auto`` passes it by, saying why (DeviceStatus.not_auto)."""
    import importlib.util

    from uaii.backends import registry

    monkeypatch.setattr(gpu, "_load", lambda names: (_FakeCuda(), ""))
    status = gpu.CudaBackend().probe()
    assert status.devices == ["cuda:0 Fake GPU", "cuda:1 Fake GPU"]
    if importlib.util.find_spec("cuda.bindings") is None:
        assert not status.available and "cuda-bindings is not installed" in status.reason
        return
    assert status.available and "has not run on a GPU" in status.not_auto
    monkeypatch.setattr(registry, "_instances", {"cuda": gpu.CudaBackend()})
    monkeypatch.setattr(registry, "backend_names", lambda: ["cpu", "cuda"])
    with caplog.at_level("WARNING", logger="uaii.backends"):
        assert select_device("auto").name == "cpu"
    assert "cuda: found cuda:0 Fake GPU, cuda:1 Fake GPU; device auto does not pick cuda yet" in caplog.text
    assert select_device("cuda").name == "cuda"


def test_cuda_without_devices_and_failing_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoDevice(_FakeCuda):
        cuInit = _Fn(lambda flags: 100)

    monkeypatch.setattr(gpu, "_load", lambda names: (NoDevice(), ""))
    assert "CUDA_ERROR_NO_DEVICE" in gpu.CudaBackend().probe().reason

    def boom(names: Any) -> Any:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(gpu, "_load", boom)
    status = gpu.VulkanBackend().probe()  # a probe never raises
    assert not status.available and "driver exploded" in status.reason


class _FakeVulkan:
    vkCreateInstance = _Fn(lambda info, alloc, ref: 0)
    vkDestroyInstance = _Fn(lambda inst, alloc: None)

    @staticmethod
    def _enum(inst: Any, count: Any, handles: Any) -> int:
        _set(count, 2)
        return 0

    @staticmethod
    def _props(handle: Any, buf: Any) -> None:
        cpu = handle.value == 2
        dev_type = (4 if cpu else 2).to_bytes(4, "little")
        name = b"llvmpipe (LLVM 15)" if cpu else b"Radeon Fake"
        ctypes.memmove(ctypes.addressof(buf) + 16, dev_type + name + b"\0", 4 + len(name) + 1)

    vkEnumeratePhysicalDevices = _Fn(_enum)
    vkGetPhysicalDeviceProperties = _Fn(_props)


def test_vulkan_software_rasterizers_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeVulkan()

    def enum(inst: Any, count: Any, handles: Any) -> int:
        _set(count, 2)
        if handles is not None:
            handles[0], handles[1] = 1, 2
        return 0

    fake.vkEnumeratePhysicalDevices = _Fn(enum)  # type: ignore[misc]
    monkeypatch.setattr(gpu, "_load", lambda names: (fake, ""))
    status = gpu.VulkanBackend().probe()
    assert status.devices == ["vulkan:0 Radeon Fake (discrete)"]

    def only_cpu(inst: Any, count: Any, handles: Any) -> int:
        _set(count, 1)
        if handles is not None:
            handles[0] = 2
        return 0

    fake.vkEnumeratePhysicalDevices = _Fn(only_cpu)  # type: ignore[misc]
    status = gpu.VulkanBackend().probe()
    assert not status.available and status.devices == [] and "software only: vulkan:0 llvmpipe" in status.reason


def test_host_memory_slots() -> None:
    cpu = get_backend("cpu")
    buf = cpu.alloc(100)
    assert buf.nbytes == 100 and buf.ctypes.data % 64 == 0 and not buf.any()
    src = np.arange(25, dtype=np.float32)
    cpu.copy(src, buf)
    assert np.array_equal(buf.view(np.float32), src)
    caps = cpu.capabilities
    assert {"f32", "f16", "bf16", "i64"} <= caps.activation_dtypes and {"q4_k", "q8_0"} <= caps.weight_dtypes
