"""CUDA graphs in the CUDA executor: a binding whose steps are device work only is captured on its second run with
the same key and replayed from then on (uaii.backends.cuda.executable's module doc).

On the host model (uaii.backends.cuda.host.HostDevice) a replay queues the recorded launches with the argument
values they were captured with — so an argument that changes from step to step and was captured anyway replays
stale and the logits show it — and anything that would break a capture on a device (a host wait, an event, an
allocation, work on another stream) raises. The same decode on a device runs where one exists.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_scripts import load_script

from uaii.backends.base import BackendError
from uaii.backends.cuda import geometry
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.host import HostDevice
from uaii.backends.testing import greedy_steps

Long = ctypes.c_longlong


def opened(path: Path) -> Iterator[tuple[Any, Any]]:
    from uaii.loaders import load_model
    from uaii.storage import MmapStore

    model = load_model(path)
    with MmapStore(model.weights) as store:
        yield model, store


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> Iterator[tuple[Any, Any]]:
    yield from opened(smollm2_path)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A 4-layer synthetic llama (random Q4_0, bench/synth_gguf.py): what a device machine without the model files
    decodes."""
    pytest.importorskip("gguf")
    synth = load_script("bench/synth_gguf.py", "synth_gguf_for_cuda_graphs")
    path = synth.write_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_layers=4, d_model=256, n_heads=4,
                                  n_kv_heads=2, d_ff=512, vocab=1024)
    yield from opened(path)


def greedy(exe: Any, state: Any, prompt: list[int], steps: int) -> list[np.ndarray]:
    """The logits of the prompt and of ``steps`` greedy decode steps after it."""
    return list(itertools.islice(greedy_steps(exe, state, prompt), steps + 1))


def decode(dev: Any, model: Any, store: Any, steps: int, *, graphs: bool, **compile: Any) -> tuple[list[np.ndarray],
                                                                                                   int]:
    exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=16, cuda_graphs=graphs, **compile)
    try:
        logits = greedy(exe, exe.new_state(64), [1, 504, 38, 282, 1000], steps)
        return logits, exe.graph_launches
    finally:
        exe.close()


@pytest.mark.parametrize("kind,model", [("host", "smollm2"), ("host", "synthetic"), ("cuda", "synthetic")])
def test_decode_replays_one_graph_per_step(kind: str, model: str, request: pytest.FixtureRequest,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 (and a synthetic llama, which a device machine has): 8 greedy decode steps — the first runs its
    launches, the second captures them, every later one is one graph launch — give the logits of launching every
    kernel every step, bit for bit (the same kernels on the same bytes); the kernels are queued twice, not 8 times."""
    graph, store = request.getfixturevalue(model)
    dev = HostDevice() if kind == "host" else request.getfixturevalue("gpu")
    calls = [0]
    if kind == "host":
        real = dev.launch

        def counted(*args: Any, **kw: Any) -> None:
            calls[0] += 1
            real(*args, **kw)
        monkeypatch.setattr(dev, "launch", counted)
    eager, none = decode(dev, graph, store, 8, graphs=False)
    eager_calls, calls[0] = calls[0], 0
    replayed, launches = decode(dev, graph, store, 8, graphs=True)
    assert none == 0 and launches == 7
    for a, b in zip(replayed, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    if kind == "host":
        per_step = (eager_calls - calls[0]) // 6  # 6 decode steps fewer were queued kernel by kernel
        assert per_step > (200 if model == "smollm2" else 20) and calls[0] == eager_calls - 6 * per_step
        assert dev.mem.live_bytes == 0  # the graphs and everything else freed when the executables closed


def test_a_changing_argument_replays_stale_so_the_host_model_shows_it(smollm2: tuple[Any, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The instrument can fail: the KV write's slot passed as a value the host sets at each launch (as it once
    was: the state's length as an argument) instead of read from the tables is captured once and replayed — every
    later token's keys land in the captured step's slot, and the logits part from the eager run's."""
    from uaii.backends.analysis import kv_layout

    model, store = smollm2
    layers = len(kv_layout(model.graph).layers)
    dev = HostDevice()
    eager, _ = decode(dev, model, store, 6, graphs=False)
    pool = dev.alloc(8 * 2 * layers * 8)  # one word per decode kv_store launch: its slot's "used" as the host sets it
    calls = [0]
    real_launch = dev.launch

    def launch(module: str, kernel: str, at: Any, *args: Any, stream: Any = None) -> None:
        if kernel == "kv_store" and args[2].value == 1:  # a decode row: its used entry as a host-set argument
            step = calls[0] // (2 * layers)
            word = pool.ptr + 8 * calls[0]
            dev.mem.array(word, np.int64, 1)[0] = 5 + step + 1  # the prompt's 5 tokens, then one per step
            calls[0] += 1
            args = (*args[:5], ctypes.c_uint64(word), *args[6:])
        real_launch(module, kernel, at, *args, stream=stream)
    monkeypatch.setattr(dev, "launch", launch)
    replayed, launches = decode(dev, model, store, 6, graphs=True)
    assert launches == 5 and calls[0] == 2 * 2 * layers  # two decode steps queued their launches, five replayed
    for i in range(3):  # the prompt, the eager step and the captured one are right
        np.testing.assert_array_equal(replayed[i], eager[i])
    assert not np.allclose(replayed[-1], eager[-1], atol=1e-2)


def test_host_work_between_launches_is_never_captured(smollm2: tuple[Any, Any]) -> None:
    """With the weights of a layer streamed in 1 MiB pieces, the host stages pieces between launches: such a
    binding runs its steps every time (no graph), with the resident run's logits."""
    model, store = smollm2
    resident, _ = decode(HostDevice(), model, store, 4, graphs=True)
    dev = HostDevice()
    names = [t.name for t in model.graph.tensors if t.is_weight and t.name.startswith("blk.1.")]
    streamed, launches = decode(dev, model, store, 4, graphs=True, streamed=_keys(model, names), chunk_bytes=1 << 20)
    assert names and launches == 0 and dev.graph_launches == 0
    for a, b in zip(streamed, resident, strict=True):
        np.testing.assert_array_equal(a, b)


def _keys(model: Any, names: list[str]) -> list[str]:
    from uaii.backends.base import weight_key

    tmap = model.graph.tensor_map
    return [weight_key(tmap[n]) for n in names]


def test_states_of_other_capacities_and_a_grown_scratch_recapture(smollm2: tuple[Any, Any]) -> None:
    """Two sequences whose caches have different capacities take turns (a graph is keyed by the capacities), and a
    long prompt in between grows the attention scratch (every graph reading the old one is dropped): each
    sequence's logits are those of running it alone without graphs."""
    model, store = smollm2
    dev = HostDevice()
    exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=48, cuda_graphs=True)
    plain = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=48, cuda_graphs=False)
    try:
        a, b = exe.new_state(32), exe.new_state(96)
        a2, b2 = plain.new_state(32), plain.new_state(96)
        prompt = [1, 504, 3458]
        for st, twin in ((a, a2), (b, b2)):
            first = st.reserve(3)
            twin.reserve(3)
            feeds = {"tokens": np.array(prompt), "positions": np.arange(first, first + 3)}
            np.testing.assert_array_equal(exe.run(feeds, st)["logits"], plain.run(feeds, twin)["logits"])
        rng = np.random.default_rng(3)
        for step in range(7):
            if step == 4:  # a long prompt of a third sequence: the scores scratch grows
                assert any(bd.graphs for bd in exe._bindings.values())
                c = exe.new_state(96)
                ids = rng.integers(0, 49152, 40)
                exe.run({"tokens": ids, "positions": np.arange(c.reserve(40), 40)}, c)
                assert not any(bd.graphs for bd in exe._bindings.values())
            for st, twin in ((a, a2), (b, b2)):  # one decode binding, two keys
                token = int(rng.integers(0, 49152))
                feeds = {"tokens": np.array([token]), "positions": np.array([st.reserve(1)])}
                twin.reserve(1)
                np.testing.assert_array_equal(exe.run(feeds, st)["logits"], plain.run(feeds, twin)["logits"])
        assert exe.graph_launches >= 8  # each sequence's decode replayed its own graph
    finally:
        exe.close()
        plain.close()


# --- the host model's capture ----------------------------------------------------------------------------------------
def test_the_host_model_records_launches_and_refuses_what_breaks_a_capture() -> None:
    """A replay reads memory as it is when it runs, with the argument values the capture saw; a host wait, an event,
    an allocation or work on another stream during a capture raise; a free waits for the end of the capture."""
    dev = HostDevice()
    s, other = dev.stream(), dev.stream()
    a = dev.upload(np.arange(8, dtype=np.float32))
    y = dev.upload(np.zeros(8, np.float32))
    spare = dev.alloc(64)
    dev.begin_capture(s)
    assert dev.capturing(s) and not dev.capturing(other)
    dev.launch("ops", "add", geometry.elementwise(8), a, a, y, Long(8), stream=s)
    for what, call in (("a host wait", lambda: dev.sync_stream(s)), ("cuMemAlloc", lambda: dev.alloc(4)),
                       ("cuEventRecord", lambda: dev.record(dev.event(), s)),
                       ("work queued on stream 2", lambda: dev.copy_dtod(y.ptr, a.ptr, 4, other))):
        with pytest.raises(BackendError, match=f"{what}.*captures a graph"):
            call()
    dev.free(spare)                                   # deferred: the capture goes on
    assert dev.mem.live_bytes == 64 + 2 * 32
    graph = dev.end_capture(s)
    assert dev.mem.live_bytes == 2 * 32 and not dev.capturing(s)
    dev.sync_stream(s)
    assert not dev.download(y, (8,), np.float32).any()  # captured, not run
    dev.graph_launch(graph, s)
    np.testing.assert_array_equal(dev.download(y, (8,), np.float32), 2 * np.arange(8, dtype=np.float32))
    dev.copy_htod(a.ptr, np.full(8, 5, np.float32), s)
    dev.graph_launch(graph, s)
    np.testing.assert_array_equal(dev.download(y, (8,), np.float32), np.full(8, 10, np.float32))
    dev.graph_destroy(graph)
    with pytest.raises(BackendError, match="destroyed graph"):
        dev.graph_launch(graph, s)


def test_a_capture_the_device_refuses_is_said_and_the_steps_run(synthetic: tuple[Any, Any],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A launch the device refuses while its binding is captured: the capture is ended (the stream works again), a
    warning names the error, the run's steps run (nothing of the capture ran) with the logits of launching every
    kernel, and that binding launches its kernels from then on (other bindings still capture)."""
    model, store = synthetic
    dev = HostDevice()
    want, _ = decode(dev, model, store, 5, graphs=False)
    real_launch = dev.launch
    failed: list[str] = []

    def launch(module: str, kernel: str, at: Any, *args: Any, stream: Any = None) -> None:
        if dev.capturing(stream) and not failed:  # the first capture: the decode binding's, at its second step
            failed.append(kernel)
            raise BackendError(f"[cuda] launch {kernel} failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        real_launch(module, kernel, at, *args, stream=stream)
    monkeypatch.setattr(dev, "launch", launch)
    exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=16)
    try:
        with caplog.at_level("WARNING", logger="uaii.backends"):
            got = greedy(exe, exe.new_state(64), [1, 504, 38, 282, 1000], 5)
        assert failed and not dev.capturing(exe.stream)
        assert "could not be captured as a CUDA graph" in caplog.text and "STREAM_CAPTURE_UNSUPPORTED" in caplog.text
        assert caplog.text.count("could not be captured") == 1
        assert exe.graph_launches == 0
        again = greedy(exe, exe.new_state(64), [1, 504, 38, 282, 1000], 5)  # a fresh sequence
        assert exe.graph_launches == 1  # its prompt's binding replays; the decode binding launches its kernels
    finally:
        exe.close()
    for got_run in (got, again):
        for a, b in zip(got_run, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_launching_steps_build_each_attention_layers_launches_once(synthetic: tuple[Any, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without graphs every run queues its kernels from Python: the attention launches (geometry, table addresses,
    arguments) are made once per layer and context size, not per run — and the same tokens come out."""
    from uaii.backends.cuda import lower

    built: list[int] = []
    real = lower.Binder._attention_launches

    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        built.append(args[5])  # s_max
        return real(self, *args, **kw)
    model, store = synthetic
    want, _ = decode(HostDevice(), model, store, 6, graphs=False)
    monkeypatch.setattr(lower.Binder, "_attention_launches", counted)
    got, _ = decode(HostDevice(), model, store, 6, graphs=False)
    assert len(built) == 2 * 4  # the prompt's binding and the decode step's, 4 layers each, one context size
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
