"""The CUDA executor's host time per decode step, on any machine (`make bench-cuda-host`).

A decode step of a small model is hundreds of kernel launches; on a GPU each costs the host a Python call into
cuda-bindings, and a step replayed as one CUDA graph costs one (uaii.backends.cuda.executable's module doc). This
measures what is left of the executor itself — bindings, feeds, attention tables, copies, outputs — by running it on
the host model of a device (uaii.backends.cuda.host.HostDevice) with every launch and copy stubbed out (the
arguments still checked), so the time is the executor's Python alone, replayed and launched kernel by kernel, in the
same run. A device adds the driver's own time per call (a few µs) to both.

    python bench/bench_cuda_host.py               # SmolLM2 (fetched once), 200 decode steps each way
    python bench/bench_cuda_host.py --steps 50 --model path/to/model.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def stub_device() -> Any:
    """A HostDevice whose launches and copies are checked and queued but do nothing."""
    from uaii.backends.cuda.host import HostDevice
    from uaii.backends.cuda.sources import check_args

    class StubDevice(HostDevice):
        def launch(self, module: str, kernel: str, at: Any, *args: Any, stream: Any = None) -> None:
            check_args(module, kernel, args)
            self._queue(stream, ("run", _nothing))

        def copy_htod(self, dst: int, src: np.ndarray, stream: Any = None) -> None:
            self._queue(stream, ("run", _nothing))

        def copy_dtoh(self, dst: np.ndarray, src: int, stream: Any = None) -> None:
            self._queue(stream, ("run", _nothing))

        def copy_dtod(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
            self._queue(stream, ("run", _nothing))

    return StubDevice()


def _nothing() -> None:
    return None


def host_time(path: Path, steps: int) -> dict[str, Any]:
    """Microseconds of host time per decode step, replayed and launched kernel by kernel, and the launches a step
    queues."""
    from uaii.backends.cuda.backend import CudaBackend
    from uaii.backends.testing import greedy_steps
    from uaii.loaders import load_model
    from uaii.storage import MmapStore

    model = load_model(path)
    out: dict[str, Any] = {"model": path.name, "steps": steps}
    with MmapStore(model.weights) as store:
        for graphs in (True, False):
            dev = stub_device()
            calls = [0]
            launch = dev.launch

            def counted(*args: Any, _launch: Any = launch, _calls: list[int] = calls, **kw: Any) -> None:
                _calls[0] += 1
                _launch(*args, **kw)
            dev.launch = counted  # type: ignore[method-assign]
            exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=16, cuda_graphs=graphs)
            try:
                run = greedy_steps(exe, exe.new_state(steps + 16), [1, 2, 3, 4, 5])
                for _ in range(3):  # the prompt, the eager run and the capture
                    next(run)
                calls[0] = 0
                start = time.perf_counter()
                for _ in range(steps):
                    next(run)
                per = (time.perf_counter() - start) / steps
            finally:
                exe.close()
            key = "replayed" if graphs else "launched"
            out[f"{key}_us"] = per * 1e6
            out[f"{key}_launch_calls"] = calls[0] / steps
    out["x_launched"] = out["launched_us"] / out["replayed_us"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="a GGUF (default: SmolLM2-135M, fetched once)")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    path = args.model
    if path is None:
        sys.path.insert(0, str(REPO / "bench"))
        from bench_models import model_path

        path = model_path("smollm2")
    r = host_time(path, args.steps)
    print(f"{r['model']}: host time per decode step {r['replayed_us']:.0f} us replayed as a CUDA graph "
          f"({r['replayed_launch_calls']:.0f} launch calls), {r['launched_us']:.0f} us launching each kernel "
          f"({r['launched_launch_calls']:.0f} launch calls): {r['x_launched']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
