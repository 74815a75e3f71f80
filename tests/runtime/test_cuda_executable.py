"""The CUDA executor on the host model of a device (uaii.backends.cuda.host.HostDevice): every launch it queues runs
through its kernel's CPU reference, every pointer is checked against live allocations and every argument against
the kernel's C parameter kinds, and streams run asynchronously in an adversarial order. So without a GPU the whole
executor is tested — lowering, arena addresses, KV tables, window compaction, batched rows and the double-buffered
weight streaming with its events — against the CPU backend on the real models.

What the host model cannot show — that the CUDA kernels compute what their references do, and any speed — a device
shows: where one exists, the tests taking ``kind`` run on it as well ("no CUDA device" elsewhere), and the kernels
are compared with the references' independent implementations in tests/backends/test_cuda_reference.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.backends import KVBatch, registry
from uaii.backends.base import BackendError
from uaii.backends.cuda.backend import CudaBackend
from uaii.backends.cuda.host import HostDevice
from uaii.backends.cuda.host_kernels import host_kernel_names
from uaii.runtime import Session

PROMPT = "The capital of France is"
EXACT = 1e-3  # against the CPU's exact mode (gemm="f32"): the same f32 values summed in other orders


def on_host_model(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> HostDevice:
    """``device="cuda"`` runs on a fresh host model for this test."""
    dev = HostDevice(**kw)
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=dev))
    return dev


@pytest.fixture(params=["host", "cuda"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def on_device(kind: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, **kw: Any) -> Any:
    """``device="cuda"`` runs on a fresh host model (its references; ``compiled``: the CUDA source built by the
    host compiler where its threads are independent), or on the real device."""
    if kind in ("host", "compiled"):
        return on_host_model(monkeypatch, **kw, **({"kernels": "compiled"} if kind == "compiled" else {}))
    dev = request.getfixturevalue("gpu")
    monkeypatch.setitem(registry._instances, "cuda", CudaBackend(device=dev))
    return dev


def logits_of(session: Session, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens after ``prompt`` and the logits each was chosen from."""
    out = [session.forward(prompt)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(out[-1])))
        out.append(session.forward([tokens[-1]]))
    return tokens, out


Runs = dict[Any, tuple[list[int], list[np.ndarray]]]


@pytest.fixture(scope="module")
def cpu_runs() -> Runs:
    return {}


def cpu_exact(path: Path, runs: Runs, prompt: list[int], steps: int, **options: Any) -> tuple[list[int],
                                                                                             list[np.ndarray]]:
    """The CPU's greedy tokens and logits, exact (gemm="f32") unless ``options`` say otherwise."""
    options = {"gemm": "f32", **options}
    key = (path, tuple(prompt), steps, tuple(sorted(options.items())))
    if key not in runs:
        with Session(path, plan_cache=False, **options) as s:
            runs[key] = logits_of(s, prompt, steps)
    return runs[key]


def assert_close(got: tuple[list[int], list[np.ndarray]], want: tuple[list[int], list[np.ndarray]],
                 tol: float = EXACT) -> None:
    assert got[0] == want[0], f"tokens {got[0]} != the cpu's {want[0]}"
    for i, (a, b) in enumerate(zip(got[1], want[1], strict=True)):
        err = float(np.abs(a - b).max())
        assert err < tol, f"step {i}: max |logit difference| {err} >= {tol}"


@pytest.mark.parametrize("kind", ["host", "compiled", "cuda"])
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_models_match_the_exact_cpu_path(model: str, kind: str, request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch, cpu_runs: Runs) -> None:
    """SmolLM2 (llama: GQA, SwiGLU) and Gemma-3 (q/k norms, GeGLU, sliding-window layers, an embedding scale, a
    tied lm_head): resident, a 5-token prompt and greedy steps, logits within 1e-3 of the CPU's exact mode — both
    with gemm="f32" (float activations) — also with the CUDA source of the thread-local kernels (embedding rows,
    RoPE, the GLUs, the KV writes, attention's scores and sums...) built by the host compiler and run over each
    launch's grid."""
    dev = on_device(kind, monkeypatch, request)
    path = request.getfixturevalue(f"{model}_path")
    with Session(path, device="cuda", plan_cache=False, max_context=160, gemm="f32") as s:  # sums in stretches
        assert s.backend.name == "cuda" and s.plan.arena.rule == "cuda/1"
        prompt = s.tokenize(PROMPT)
        got = logits_of(s, prompt, 3 if model == "gemma3" else 6)
    assert_close(got, cpu_exact(path, cpu_runs, prompt, len(got[0]), max_context=160))
    if kind != "cuda":
        assert "gemv_q4_1_m1" in dev.launches or model == "gemma3"
        assert "attn_flash" in dev.launches and "attn_scores" not in dev.launches and "kv_store" in dev.launches
        local = sum(1 for k in dev.launches if k in host_kernel_names())  # every thread-local launch was compiled
        assert dev.compiled_launches == (local if kind == "compiled" else 0) and local > len(dev.launches) // 5


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_models_on_int8_activations_take_the_cpus_integer_path_tokens(model: str, kind: str,
                                                                      request: pytest.FixtureRequest,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      cpu_runs: Runs) -> None:
    """The default (gemm="fast"): a decode step's products are the int8 GEMV (quant_act + gemvq_<type>) on 8-bit
    activations, as the CPU's integer path's. Fed the CPU integer path's greedy tokens, its logits stay within 1.0
    of that path's (0.42 to 0.65 on these two, as far as the CPU's integer path is from its own exact one: the two
    quantize some products differently, e.g. the CPU's Q8_0 output projection takes 16-bit activations; a wrong
    offset or scale would be off by whole logits), and its argmax is the CPU's but where the CPU's top two are
    within 0.5 (SmolLM2's sixth token is such a near-tie: 1797 or 2988, as the exact path picks)."""
    dev = on_device(kind, monkeypatch, request)
    path = request.getfixturevalue(f"{model}_path")
    steps = 3 if model == "gemma3" else 6
    with Session(path, device="cuda", plan_cache=False, max_context=160) as s:
        prompt = s.tokenize(PROMPT)
        want = cpu_exact(path, cpu_runs, prompt, steps, max_context=160, gemm="fast")
        got = [s.forward(prompt), *(s.forward([t]) for t in want[0])]
    for step, (a, b) in enumerate(zip(got, want[1], strict=True)):
        assert float(np.abs(a - b).max()) < 1.0 and np.corrcoef(a, b)[0, 1] > 0.999, step
        top2 = np.sort(b)[-2:]
        assert int(np.argmax(a)) == int(np.argmax(b)) or top2[1] - top2[0] < 0.5, step
    if kind != "cuda":
        assert "quant_act" in dev.launches and any(k.startswith("gemvq_") for k in dev.launches)
        assert not any(k.startswith("gemv_q") for k in dev.launches)


def test_a_long_prompt_runs_the_int8_gemm(kind: str, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          request: pytest.FixtureRequest) -> None:
    """More than 8 rows go through quant_act + mmq_<type> (8-bit activations, the CPU integer path's quantizer):
    the greedy token is the exact path's and the logits stay within what 8-bit activations move (the CPU's own
    integer path is 0.64 from the exact one here; a wrong offset or stride would be off by whole logits)."""
    dev = on_device(kind, monkeypatch, request)
    text = "Paris is the capital and largest city of France. It is known for the Eiffel Tower and the Louvre, and"
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64) as s:
        prompt = s.tokenize(text)
        assert len(prompt) > 8
        got = s.forward(prompt)
    with Session(smollm2_path, plan_cache=False, max_context=64, gemm="f32") as c:
        want = c.forward(prompt)
    assert kind != "host" or ("quant_act" in dev.launches and "mmq_q4_1" in dev.launches)
    assert int(np.argmax(got)) == int(np.argmax(want))
    assert float(np.abs(got - want).max()) < 1.0 and np.corrcoef(got, want)[0, 1] > 0.999


@pytest.mark.parametrize("tier", ["host-pinned", "staged"])
@pytest.mark.parametrize("order", ["ahead", "behind", "cuda"])
def test_a_model_larger_than_the_device_budget_streams(order: str, tier: str, smollm2_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       request: pytest.FixtureRequest) -> None:
    """Under a 40 MiB device budget (SmolLM2's weights are 92 MiB) half of the weights stream through the two
    device slots every step — from page-locked host copies made once (no host budget: the host-pinned tier), or
    read from the store through the page-locked staging buffers (under a host budget); with the copy stream
    running ahead of the kernels or behind them, the logits are bit for bit the resident run's (on a device: the
    same kernels on the same bytes, so bit for bit too)."""
    kind = "cuda" if order == "cuda" else "host"
    on_device(kind, monkeypatch, request)
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64) as s:
        prompt = s.tokenize(PROMPT)
        resident = logits_of(s, prompt, 3)
    dev = on_device(kind, monkeypatch, request, **({} if kind == "cuda" else {"order": order}))
    host = {"budget_bytes": 4 << 30} if tier == "staged" else {}
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64, gpu_budget_bytes=40 << 20,
                 **host) as s:
        res = s.device_residency
        assert res is not None and len(res.streamed) > 100 and res.resident_bytes <= 40 << 20
        streamed = logits_of(s, prompt, 3)
        locked = s._exe.locked_bytes
    assert (locked > 60 << 20) if tier == "host-pinned" else locked == 0
    assert streamed[0] == resident[0]
    for a, b in zip(streamed[1], resident[1], strict=True):
        np.testing.assert_array_equal(a, b)
    if kind == "host":
        assert dev.mem.live_bytes == 0  # everything the session allocated was freed when it closed


def test_a_streamed_embedding_table_reads_only_the_rows_the_tokens_select(smollm2_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a 16 MiB device budget the tied token_embd table streams: the Embedding's piece is the prompt's rows
    gathered on the host (one @rows= read per distinct token), the output projection's pieces are its row chunks;
    the logits are the resident run's, bit for bit, under a host budget (staged) and without (host-pinned)."""
    on_host_model(monkeypatch)
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64, max_batch=8) as s:
        prompt = s.tokenize(PROMPT)
        resident = s.forward(prompt)
    for host in ({}, {"budget_bytes": 4 << 30}):
        on_host_model(monkeypatch)
        with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64, max_batch=8,
                     gpu_budget_bytes=16 << 20, **host) as s:
            res = s.device_residency
            assert res is not None and any(r.endswith("#token_embd.weight") for r in res.streamed)
            got = s.forward(prompt)
            gathered = [p for p in s._exe._current.pieces if p.form == "gather"]
        assert len(gathered) == 1 and gathered[0].stop == len(prompt)
        np.testing.assert_array_equal(got, resident)


@pytest.mark.parametrize("order,dropped", [("behind", "compute"), ("ahead", "copy")])
def test_the_host_model_catches_a_missing_wait(order: str, dropped: str, smollm2_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The instrument can fail: dropping the kernels' wait for their piece's copy (with the copies lagging), or
    the copy's wait for the kernels that read the slot before (with the copies running ahead), gives wrong logits
    on the host model — as it would on a GPU, only sometimes."""
    on_host_model(monkeypatch)
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64, gpu_budget_bytes=40 << 20) as s:
        prompt = s.tokenize(PROMPT)
        good = s.forward(prompt)
    dev = on_host_model(monkeypatch, order=order)
    real_wait = dev.wait
    skipped = []

    def wait(stream: Any, event: Any) -> None:  # the executor's compute stream is made first (1), its copies' next
        if stream.index == (1 if dropped == "compute" else 2):
            skipped.append(stream.index)
            return
        real_wait(stream, event)
    monkeypatch.setattr(dev, "wait", wait)
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64, gpu_budget_bytes=40 << 20) as s:
        bad = s.forward(prompt)
    assert skipped and not np.allclose(bad, good, atol=1e-2)


def test_batched_rows_are_each_rows_own_run(kind: str, smollm2_path: Path, request: pytest.FixtureRequest) -> None:
    """A KVBatch decode step (one row per sequence, each attending over its own cache; the model's graph, which
    keeps every row's logits) gives every row the logits of that sequence's step alone, bit for bit on the host
    model; rows leave and join between steps."""
    from uaii.loaders import load_model
    from uaii.storage import MmapStore

    model = load_model(smollm2_path)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 49152, n).tolist() for n in (3, 9, 5, 1)]
    with MmapStore(model.weights) as store:
        dev = HostDevice() if kind == "host" else request.getfixturevalue("gpu")
        exe = CudaBackend(device=dev).compile(model.graph, None, store, max_tokens=16)
        try:
            states, twins = [], []
            for ids in prompts:
                for group in (states, twins):
                    st = exe.new_state(64)
                    first = st.reserve(len(ids))
                    exe.run({"tokens": np.array(ids), "positions": np.arange(first, first + len(ids))}, st)
                    group.append(st)
            batch = KVBatch()
            rows = [0, 1, 2]
            for step in range(3):
                if step == 2:
                    rows = [2, 3, 0]
                batch.set([states[i] for i in rows])
                ids = rng.integers(0, 49152, len(rows))
                pos = [states[i].reserve(1) for i in rows]
                got = exe.run({"tokens": ids, "positions": np.array(pos)}, batch)["logits"]
                for r, i in enumerate(rows):
                    want = exe.run({"tokens": ids[r:r + 1], "positions": np.array([twins[i].reserve(1)])},
                                   twins[i])["logits"]
                    if kind == "host":
                        np.testing.assert_array_equal(got[r], want[0])
                    else:  # a GEMV of 2 or 4 rows is another instantiation: its sums may contract differently
                        np.testing.assert_allclose(got[r], want[0], rtol=0, atol=1e-4)
            assert [st.length for st in states] == [t.length for t in twins]
        finally:
            exe.close()


def test_a_windowed_f16_cache_matches_the_cpu(kind: str, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             request: pytest.FixtureRequest, cpu_runs: Runs) -> None:
    """A resident window of 16 tokens + 4 sinks in an f16 cache: 24 steps compact it (device copies through a
    scratch buffer), and the tokens and logits follow the CPU's exact path with the same window and cache type,
    both with float activations (to 2e-2: the halves the two keep are the same, the sums over them are ordered
    differently)."""
    on_device(kind, monkeypatch, request)
    opts: dict[str, Any] = {"max_context": 64, "kv_window": 16, "kv_sinks": 4, "kv_dtype": "f16", "max_batch": 8,
                            "gemm": "f32"}
    with Session(smollm2_path, device="cuda", plan_cache=False, **opts) as s:
        prompt = s.tokenize(PROMPT)
        got = logits_of(s, prompt, 24)
    assert_close(got, cpu_exact(smollm2_path, cpu_runs, prompt, 24, **opts), tol=2e-2)


def test_what_it_cannot_run_is_refused_naming_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """A supported op in a form it does not run (integer arithmetic narrower than the device's words) is refused at
    compile time with the node's name — never run in part; a product by an activation (refused until the general
    product) runs."""
    from uaii.backends.base import ArrayWeights
    from uaii.ir import DType, Node, Tensor, make_graph

    on_host_model(monkeypatch)
    backend = registry._instances["cuda"]
    narrow = make_graph("narrow", [Node("narrow", "Add", ("a", "b"), ("y",), {})],
                        [Tensor(n, DType.I8, (4, 32)) for n in ("a", "b", "y")], ["a", "b"], ["y"])
    with pytest.raises(BackendError, match=r"'narrow'.*integer arithmetic on i8"):
        backend.compile(narrow, None, ArrayWeights(), kv_state=False)
    mm = make_graph("mm", [Node("mm", "MatMul", ("x", "w"), ("y",), {"transpose_b": True})],
                    [Tensor("x", DType.F32, (4, 32)), Tensor("w", DType.F32, (32, 32)),
                     Tensor("y", DType.F32, (4, 32))], ["x", "w"], ["y"])
    rng = np.random.default_rng(2)
    x, wa = rng.standard_normal((4, 32)).astype(np.float32), rng.standard_normal((32, 32)).astype(np.float32)
    exe = backend.compile(mm, None, ArrayWeights(), kv_state=False)
    np.testing.assert_allclose(exe.run({"x": x, "w": wa})["y"], x @ wa.T, rtol=1e-5, atol=1e-5)
    exe.close()
    w = np.random.default_rng(1).standard_normal((48, 64)).astype(np.float32)
    ok = make_graph("mm", [Node("mm", "MatMul", ("x", "w"), ("y",), {"transpose_b": True})],
                    [Tensor("x", DType.F32, (3, 64)), Tensor("w", DType.F32, (48, 64), is_weight=True),
                     Tensor("y", DType.F32, (3, 48))], ["x"], ["y"])
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    exe = backend.compile(ok, None, ArrayWeights({"w": w}), kv_state=False)
    np.testing.assert_allclose(exe.run({"x": x})["y"], x @ w.T, rtol=1e-5, atol=1e-5)
    exe.close()
    with pytest.raises(BackendError, match="gemm must be one of fast, f32, found 'int4'"):
        backend.compile(ok, None, ArrayWeights({"w": w}), kv_state=False, gemm="int4")


@pytest.mark.parametrize("kind", ["host", "compiled"])
def test_attention_mask_forms_beyond_the_conformance_cases(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Attention whose bool mask is a constant (uploaded as the i32 words attn_mask reads) and whose keys and
    values (with their past) are one batch element read by both of q's matches the IR reference; sink tokens in a
    bidirectional window, which the kernels' positions cannot express, are refused naming the node."""
    from uaii.backends.base import ArrayWeights
    from uaii.ir import DType, Node, Tensor, make_graph
    from uaii.ir.reference.attention import attention

    on_host_model(monkeypatch, **({"kernels": "all"} if kind == "compiled" else {}))
    backend = registry._instances["cuda"]
    rng = np.random.default_rng(5)
    keep = rng.random((3, 5)) > 0.4
    keep[1] = False                                                  # query 1 keeps no key: zeros
    feeds = {"q": rng.standard_normal((2, 3, 4, 8)), "k": rng.standard_normal((1, 3, 2, 8)),
             "v": rng.standard_normal((1, 3, 2, 8)), "pk": rng.standard_normal((1, 2, 2, 8)),
             "pv": rng.standard_normal((1, 2, 2, 8))}
    feeds = {n: a.astype(np.float32) for n, a in feeds.items()}
    tensors = [Tensor(n, DType.F32, a.shape) for n, a in feeds.items()]
    tensors += [Tensor("m", DType.BOOL, (3, 5), data=keep.tobytes()), Tensor("y", DType.F32, (2, 3, 4, 8)),
                Tensor("present_k", DType.F32, (1, 5, 2, 8)), Tensor("present_v", DType.F32, (1, 5, 2, 8))]
    ins, outs = ("q", "k", "v", "pk", "pv", "m"), ("y", "present_k", "present_v")
    graph = make_graph("masked", [Node("att", "Attention", ins, outs, {"n_heads": 4, "n_kv_heads": 2})], tensors,
                       list(feeds), list(outs))
    exe = backend.compile(graph, None, ArrayWeights(), kv_state=False)
    got = exe.run(feeds)
    exe.close()
    want = attention(feeds["q"], feeds["k"], feeds["v"], feeds["pk"], feeds["pv"], keep)
    for name, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)
    sinks = make_graph("sinks", [Node("att", "Attention", ("q", "q", "q"), ("y",),
                                      {"causal": False, "sliding_window": 2, "sinks": 1})],
                       [Tensor("q", DType.F32, (4, 2, 8)), Tensor("y", DType.F32, (4, 2, 8))], ["q"], ["y"])
    with pytest.raises(BackendError, match=r"'att'.*sink tokens in a sliding window without a causal mask"):
        backend.compile(sinks, None, ArrayWeights(), kv_state=False)


def test_memory_and_states_are_checked(kind: str, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      request: pytest.FixtureRequest) -> None:
    """The arena is the plan's; a state of another backend is refused before anything runs."""
    on_device(kind, monkeypatch, request)
    with Session(smollm2_path, device="cuda", plan_cache=False, max_context=64) as s:
        exe = s._exe
        mem = exe.memory()
        assert mem.device == "device" and mem.arena_bytes == s.plan.arena.size
        assert 80 << 20 < mem.weight_bytes < 100 << 20
        with Session(smollm2_path, plan_cache=False, max_context=64) as c:
            cpu_state = c._exe.new_state(8)
            with pytest.raises(BackendError, match="KV state of this executable's device"):
                exe.run({"tokens": np.array([1]), "positions": np.array([0])}, cpu_state)
