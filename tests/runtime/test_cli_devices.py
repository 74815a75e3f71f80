"""`uaii devices` lists every WebGPU adapter (software ones marked) with its limits, says why there are none, and
the device flags of run/chat/bench (--device, --allow-software-adapter, --gpu-budget) reach the Session."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from uaii.backends.webgpu import device
from uaii.backends.webgpu.device import ALLOW_SOFTWARE_ENV
from uaii.runtime.cli import build_parser, main
from uaii.runtime.presets import GiB


def run(argv: list[str], capsys: pytest.CaptureFixture[str], factory: Any = None) -> tuple[int, str, str]:
    code = main([str(a) for a in argv], session_factory=factory)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _no_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "0")  # recorded, so whatever a test sets is undone
    monkeypatch.setenv("COLUMNS", "160")


def software_adapters() -> list[Any]:
    pytest.importorskip("wgpu", reason="the webgpu backend needs `wgpu` (pip install 'uaii-backends[webgpu]')")
    found = [a for a in device.adapters() if a.software and a.usable]
    if not found:
        pytest.skip("no software WebGPU adapter here (CI installs mesa-vulkan-drivers for lavapipe)")
    return found


def test_devices_lists_the_software_adapter_with_its_limits(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    soft = software_adapters()[0]
    code, out, _ = run(["devices", "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    listed = {a["index"]: a for a in obj["webgpu_adapters"]}
    row = listed[soft.index]
    assert row["software"] is True and row["name"] == soft.name and row["backend"] == soft.backend
    assert row["driver"] == soft.driver and row["type"] == soft.adapter_type
    assert row["limits"]["max-storage-buffer-binding-size"] == soft.limits["max-storage-buffer-binding-size"]
    assert set(row["limits"]) >= {"max-buffer-size", "max-storage-buffers-per-shader-stage",
                                  "max-compute-workgroup-storage-size"}
    webgpu = {r["name"]: r for r in obj["backends"]}["webgpu"]
    if not any(not a["software"] and a["usable"] for a in obj["webgpu_adapters"]):
        assert not webgpu["available"] and "--allow-software-adapter" in webgpu["reason"]
    code, out, err = run(["devices", "--no-color"], capsys)
    assert code == 0 and "webgpu adapters" in out and soft.name.split(" ")[0] in out
    line = next(x for x in out.splitlines() if x.startswith(f"│ {soft.index} "))
    assert "│ yes " in line  # the software column
    assert "--device auto never picks one" in err
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "1")  # opted in: available, and marked software
    code, out, _ = run(["devices", "--json"], capsys)
    webgpu = {r["name"]: r for r in json.loads(out)["backends"]}["webgpu"]
    assert webgpu["available"] and (webgpu["software"] or not soft.usable)


def test_devices_without_wgpu_says_why(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "_adapters", None)
    monkeypatch.setitem(sys.modules, "wgpu", None)
    code, out, _ = run(["devices", "--json"], capsys)
    obj = json.loads(out)
    assert code == 0 and obj["webgpu_adapters"] == [] and "not installed" in obj["webgpu_adapters_reason"]
    code, out, _ = run(["devices", "--no-color"], capsys)
    assert code == 0 and "webgpu adapters: none (the `wgpu` package is not installed" in out


class Recorder:
    """A session factory that records the options and stops the command there."""

    options: ClassVar[dict[str, Any]] = {}

    def __call__(self, path: str, **options: Any) -> Any:
        Recorder.options = {**options, "_allow_env": os.environ.get(ALLOW_SOFTWARE_ENV)}
        raise KeyboardInterrupt  # exit code 130, after the options were seen


@pytest.mark.parametrize("command", [["run", "-p", "hi"], ["chat"], ["bench"]])
def test_device_flags_reach_the_session(command: list[str], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read")
    argv = [command[0], model, *command[1:], "--device", "webgpu", "--gpu-budget", "1.5GiB",
            "--allow-software-adapter"]
    code, _, _ = run(argv, capsys, Recorder())
    assert code == 130
    o = Recorder.options
    assert o["device"] == "webgpu" and o["gpu_budget_bytes"] == int(1.5 * GiB) and o["_allow_env"] == "1"
    code, _, _ = run([command[0], model, *command[1:]], capsys, Recorder())
    assert "device" not in Recorder.options and "gpu_budget_bytes" not in Recorder.options  # the Session's defaults


def test_bad_device_flags_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"not read")
    code, _, err = run(["run", model, "-p", "hi", "--gpu-budget", "lots"], capsys, Recorder())
    assert code == 1 and "error: [preset] cannot read 'lots' as a byte size" in err
    code, _, err = run(["run", model, "-p", "hi", "--device", " "], capsys, Recorder())
    assert code == 1 and "--device needs a backend name" in err
    args = build_parser().parse_args(["bench", "m.gguf", "--device", "auto"])
    assert args.device == "auto" and args.gpu_budget is None and not args.allow_software_adapter
