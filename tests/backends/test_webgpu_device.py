"""WebGPU adapter policy: software adapters recognised from what wgpu reports, hardware first, a software adapter
only on an explicit opt-in and never through ``device="auto"``, ``UAII_WEBGPU_ADAPTER``, the device memory the
backend plans with (Vulkan's device-local heap), and ``import uaii.backends`` without wgpu.

The policy tests run on fake adapter lists (no wgpu needed); the last ones look at the real adapters (lavapipe in
CI) and skip without wgpu."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from uaii.backends import BackendError, BackendUnavailable, get_backend, gpu, select_device
from uaii.backends.webgpu import device
from uaii.backends.webgpu.device import ADAPTER_ENV, ALLOW_SOFTWARE_ENV, adapter_info, choose, is_software

GiB = 1 << 30
LIMITS = {"max-buffer-size": 2**31 - 1, "max-storage-buffer-binding-size": 1 << 27,
          "max-storage-buffers-per-shader-stage": 32, "max-compute-workgroup-storage-size": 32768,
          "max-bind-groups": 8}
LAVAPIPE = {"vendor": "llvmpipe", "device": "llvmpipe (LLVM 15.0.6, 256 bits)",
            "description": "Mesa 22.3.6 (LLVM 15.0.6)", "vendor_id": 65541, "device_id": 0, "adapter_type": "CPU",
            "backend_type": "Vulkan"}
RTX = {"vendor": "NVIDIA", "device": "NVIDIA GeForce RTX 4090", "description": "550.54", "vendor_id": 0x10DE,
       "device_id": 0x2684, "adapter_type": "DiscreteGPU", "backend_type": "Vulkan"}
IGPU = {"vendor": "Intel", "device": "Intel(R) UHD Graphics 770", "description": "Mesa 23", "vendor_id": 0x8086,
        "device_id": 0x4680, "adapter_type": "IntegratedGPU", "backend_type": "Vulkan"}


def fake(index: int, info: dict[str, Any], memory: int = 0) -> tuple[Any, object]:
    return adapter_info(index, info, LIMITS, ["shader-f16", "subgroup", "float32-filterable"], memory), object()


@pytest.fixture
def adapters(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Replace the enumerated adapters with a fake list (and leave no opt-in set from outside)."""
    monkeypatch.delenv(ADAPTER_ENV, raising=False)
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "0")

    def use(*found: tuple[Any, object]) -> None:
        monkeypatch.setattr(device, "_adapters", list(found))

    return use


# ----------------------------------------------------------------------------------------- software detection
@pytest.mark.parametrize(("info", "software"), [
    (LAVAPIPE, True),
    ({**LAVAPIPE, "backend_type": "OpenGL", "vendor": ""}, True),
    ({"device": "SwiftShader Device (Subzero)", "vendor": "Google", "adapter_type": "Unknown"}, True),
    ({"device": "Microsoft Basic Render Driver", "adapter_type": "Unknown", "backend_type": "D3D12"}, True),
    ({"device": "softpipe", "adapter_type": "Other"}, True),
    (RTX, False),
    (IGPU, False),
    ({"device": "Apple M2 Max", "vendor": "apple", "adapter_type": "IntegratedGPU", "backend_type": "Metal"}, False),
])
def test_software_adapters_are_recognised_from_adapter_info(info: dict[str, Any], software: bool) -> None:
    assert is_software(info) is software
    assert adapter_info(0, info, {}, []).software is software


def test_adapter_info_from_what_wgpu_reports() -> None:
    info, _ = fake(3, RTX, memory=24 * GiB)
    assert (info.index, info.name, info.vendor, info.backend, info.adapter_type, info.driver) == (
        3, "NVIDIA GeForce RTX 4090", "NVIDIA", "Vulkan", "DiscreteGPU", "550.54")
    assert (info.vendor_id, info.device_id, info.device_memory) == (0x10DE, 0x2684, 24 * GiB)
    d = info.as_dict()
    assert d["software"] is False and d["usable"] is True and d["memory_bytes"] == 24 * GiB
    assert set(d["limits"]) == {"max-buffer-size", "max-storage-buffer-binding-size",
                                "max-storage-buffers-per-shader-stage", "max-compute-workgroup-storage-size"}
    assert d["features"] == ["shader-f16", "subgroup"]
    # no memory report (a Metal or D3D12 adapter): the largest buffer is what the backend can count on
    assert adapter_info(0, {**RTX, "backend_type": "D3D12"}, LIMITS, []).device_memory == LIMITS["max-buffer-size"]


# --------------------------------------------------------------------------------------------------- choosing
def test_hardware_first_discrete_before_integrated_and_never_opengl(adapters: Any) -> None:
    adapters(fake(0, LAVAPIPE), fake(1, IGPU), fake(2, {**RTX, "backend_type": "OpenGL"}), fake(3, RTX))
    assert choose(True)[0].index == 3  # even with software allowed, a hardware adapter wins
    adapters(fake(0, LAVAPIPE), fake(1, IGPU))
    assert choose(None)[0].index == 1


def test_a_software_adapter_needs_an_opt_in(adapters: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    adapters(fake(0, LAVAPIPE), fake(1, {**LAVAPIPE, "backend_type": "OpenGL"}))
    with pytest.raises(BackendUnavailable, match=f"no hardware adapter.*{ALLOW_SOFTWARE_ENV}=1.*--allow-software"):
        choose(None)
    assert choose(True)[0].index == 0  # the Vulkan one: OpenGL adapters are never chosen
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "1")
    assert choose(None)[0].index == 0
    with pytest.raises(BackendUnavailable):
        choose(False)  # an explicit refusal beats the environment


def test_adapter_index_from_the_environment(adapters: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    adapters(fake(0, LAVAPIPE), fake(1, RTX))
    for bad in ("5", "-9", "first"):
        monkeypatch.setenv(ADAPTER_ENV, bad)
        with pytest.raises(BackendError, match=f"{ADAPTER_ENV}='{bad}' names no adapter; there are 2"):
            choose(True)
    monkeypatch.setenv(ADAPTER_ENV, "0")
    with pytest.raises(BackendUnavailable, match="software adapter"):
        choose(None)
    assert choose(True)[0].index == 0
    monkeypatch.setenv(ADAPTER_ENV, "1")
    assert choose(None)[0].index == 1


def test_auto_never_picks_a_software_adapter(adapters: Any, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    adapters(fake(0, LAVAPIPE))
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "1")  # the opt-in makes webgpu usable when named, not for auto
    status = get_backend("webgpu").probe()
    assert status.available and status.software and "software" in status.devices[0]
    with caplog.at_level(logging.WARNING, logger="uaii.backends"):
        assert select_device("auto").name == "cpu"
    assert "webgpu: only a software adapter" in caplog.text and "auto never picks" in caplog.text
    assert select_device("webgpu").name == "webgpu"
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "0")
    with pytest.raises(BackendError, match="device 'webgpu' is not available: no hardware adapter"):
        select_device("webgpu")


def test_auto_picks_a_hardware_adapter_and_plans_with_its_memory(adapters: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    adapters(fake(0, LAVAPIPE), fake(1, RTX, memory=24 * GiB))
    backend = select_device("auto")
    assert backend.name == "webgpu" and not backend.probe().software
    caps = backend.capabilities
    assert caps.device_memory == 24 * GiB and caps.streams_weights and "f32" in caps.kv_dtypes


def test_without_wgpu_the_probe_says_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_adapters", None)
    monkeypatch.setitem(sys.modules, "wgpu", None)  # import wgpu raises ImportError
    status = get_backend("webgpu").probe()
    assert not status.available and "`wgpu` package is not installed" in status.reason
    assert get_backend("webgpu").capabilities.device_memory == 0
    # and uaii.backends itself never imports wgpu
    code = "import sys, uaii.backends; assert 'wgpu' not in sys.modules, 'uaii.backends imported wgpu'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------ Vulkan's device memory
def memory_properties(*heaps: tuple[int, int]) -> bytes:
    """A VkPhysicalDeviceMemoryProperties: no memory types, ``heaps`` as (size, flags)."""
    raw = bytearray(520)
    raw[260:264] = len(heaps).to_bytes(4, "little")
    for i, (size, flags) in enumerate(heaps):
        raw[264 + 16 * i:272 + 16 * i] = size.to_bytes(8, "little")
        raw[272 + 16 * i:276 + 16 * i] = flags.to_bytes(4, "little")
    return bytes(raw)


def test_device_local_bytes_is_the_largest_device_local_heap() -> None:
    raw = memory_properties((256 << 20, 1), (24 * GiB, 1), (64 * GiB, 0))  # BAR, VRAM, host memory
    assert gpu.device_local_bytes(raw) == 24 * GiB
    assert gpu.device_local_bytes(memory_properties((8 * GiB, 0))) == 0
    assert gpu.device_local_bytes(memory_properties()) == 0


class _FakeVulkan:
    """Two physical devices: a discrete card with 24 GiB of VRAM, and lavapipe with 2 GiB."""

    DEVICES: ClassVar[list[tuple[int, int, int, bytes, int]]] = [
        (0x10DE, 0x2684, 2, b"NVIDIA GeForce RTX 4090", 24 * GiB), (65541, 0, 4, b"llvmpipe", 2 * GiB)]

    def vkCreateInstance(self, info: Any, alloc: Any, ref: Any) -> int:
        return 0

    def vkDestroyInstance(self, inst: Any, alloc: Any) -> None:
        pass

    def vkEnumeratePhysicalDevices(self, inst: Any, count: Any, handles: Any) -> int:
        count._obj.value = len(self.DEVICES)
        if handles is not None:
            for i in range(len(self.DEVICES)):
                handles[i] = i + 1
        return 0

    def vkGetPhysicalDeviceProperties(self, handle: Any, buf: Any) -> None:
        vendor, dev, typ, name, _ = self.DEVICES[handle.value - 1]
        raw = vendor.to_bytes(4, "little") + dev.to_bytes(4, "little") + typ.to_bytes(4, "little") + name + b"\0"
        ctypes.memmove(ctypes.addressof(buf) + 8, raw, len(raw))

    def vkGetPhysicalDeviceMemoryProperties(self, handle: Any, buf: Any) -> None:
        raw = memory_properties((self.DEVICES[handle.value - 1][4], 1))
        ctypes.memmove(ctypes.addressof(buf), raw, len(raw))


def test_vulkan_memory_of_the_adapter_by_pci_ids_and_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu, "_load", lambda names: (_FakeVulkan(), ""))
    assert gpu.vulkan_memory(0x10DE, 0x2684, "NVIDIA GeForce RTX 4090") == 24 * GiB
    assert gpu.vulkan_memory(65541, 0, "llvmpipe") == 2 * GiB
    assert gpu.vulkan_memory(0x10DE, 0x2684, "another card") == 0
    status = gpu.VulkanBackend().probe()  # the probe shares the enumeration: lavapipe does not count
    assert status.devices == ["vulkan:0 NVIDIA GeForce RTX 4090 (discrete)"] and not status.available
    monkeypatch.setattr(gpu, "_load", lambda names: (None, "libvulkan.so.1 not found"))
    assert gpu.vulkan_memory(0x10DE, 0x2684, "NVIDIA GeForce RTX 4090") == 0


# ------------------------------------------------------------------------------------------- real adapters
def test_the_real_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    found = device.adapters()
    if not found:
        pytest.skip("wgpu found no adapter on this machine")
    for a in found:
        assert a.software == is_software({"device": a.name, "vendor": a.vendor, "description": a.driver,
                                          "adapter_type": a.adapter_type})
        assert a.limits["max-storage-buffer-binding-size"] > 0 and a.device_memory > 0
    soft = [a for a in found if a.software and a.usable]
    if soft and not any(not a.software and a.usable for a in found):  # lavapipe only (CI): opt-in rules apply
        monkeypatch.delenv(ADAPTER_ENV, raising=False)
        monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "0")
        assert not get_backend("webgpu").probe().available
        assert choose(True)[0] == soft[0]
        assert soft[0].memory > 0 or soft[0].backend != "Vulkan"  # Vulkan reports its heap


def test_enumerating_adapters_leaves_torch_models_importable() -> None:
    """Only compute backends are enumerated: Mesa's OpenGL adapter (EGL + llvmpipe) loaded a second LLVM, and
    importing a transformers model afterwards crashed the interpreter (the whole test run with it)."""
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    pytest.importorskip("transformers")
    code = ("from uaii.backends.webgpu import adapters\n"
            "assert all(a.backend != 'OpenGL' for a in adapters())\n"
            "from transformers import LlamaForCausalLM\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
