"""The Session talks to its backend through declared capabilities (uaii.runtime.capabilities): what a backend does
not declare is refused with its name and the option, what it declares is used whatever its name; after compile the
executable's own memory report is held to the budget (uaii.runtime.budget.check_memory); the plan's prefetch order
is the order the streamer queues reads in. Plugin backends here are the CPU backend under other names and
capabilities (what a plugin registered under ``uaii.backends`` would be)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from repo_scripts import load_script

import uaii.backends
from uaii.backends import CpuBackend
from uaii.backends.base import ExecutableMemory
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.planner import BudgetError
from uaii.runtime import Session, SessionError
from uaii.runtime.budget import check_memory, kv_cache_bytes
from uaii.runtime.options import SessionOptions

OPTS = {"max_context": 64, "max_batch": 16}
IDS = [1, 5, 9, 33, 70]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer llama GGUF of random Q8_0 weights (no tokenizer needed: token ids)."""
    synth = load_script("bench/synth_gguf.py", "synth_gguf")
    path = tmp_path_factory.mktemp("caps") / "llama.gguf"
    return Path(synth.write_llama_gguf(path, 6, 256, 4, 2, 1024, 768, qtype="q8_0", seed=3, context=256))


@pytest.fixture(scope="module")
def reference(model: Path) -> tuple[int, list[int]]:
    """Weight bytes and the greedy tokens on the CPU backend, unbudgeted."""
    with Session(model, **OPTS) as s:
        assert s.model_info is not None
        return s.model_info.weight_bytes, list(s.generate(IDS, max_new_tokens=6, ignore_eos=True).tokens)


class Plugin(CpuBackend):
    """The CPU backend registered under another ``name``, with some capabilities changed."""

    def __init__(self, name: str, kind: str = "cpu", extra: int = 0, **caps: Any) -> None:
        self.name, self.kind, self._caps, self.extra = name, kind, caps, extra

    @property
    def capabilities(self) -> Any:
        return replace(super().capabilities, **self._caps)

    def compile(self, *args: Any, **kw: Any) -> Any:
        """The CPU executable; with ``extra``, its memory report counts that many staging bytes more (a backend
        that allocates what the plan does not count)."""
        exe = super().compile(*args, **kw)
        if self.extra:
            real = exe.memory
            exe.memory = lambda: replace(real(), staging_bytes=real().staging_bytes + self.extra)  # type: ignore
        return exe


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install a Plugin: ``device=<its name>`` selects it (as the registry would find an entry point)."""
    def install(*args: Any, **kw: Any) -> Plugin:
        backend = Plugin(*args, **kw)
        real = uaii.backends.select_device
        monkeypatch.setattr(uaii.backends, "select_device", lambda d="auto": backend if d == backend.name else real(d))
        return backend
    return install


# --- what a backend does not declare is refused -------------------------------------------------------------------
def test_a_kv_cache_a_backend_does_not_keep_is_refused(model: Path, plugin: Any) -> None:
    plugin("nokv", kv_dtypes=frozenset())
    with pytest.raises(SessionError, match=r"the nokv backend cannot run llama\.gguf with a KV cache: llama\.gguf is "
                                           r"a decoder and the backend keeps no KV state"):
        Session(model, device="nokv", **OPTS)
    plugin("f32kv", kv_dtypes=frozenset({"f32"}), kv_window=False)
    with pytest.raises(SessionError, match=r"the f32kv backend .* kv_dtype='f16': its KV states hold f32; "
                                           r"kv_window=32: its KV states keep no resident window"):
        Session(model, device="f32kv", kv_dtype="f16", kv_window=32, **OPTS)


def test_options_without_a_declared_capability_are_refused(model: Path, plugin: Any) -> None:
    plugin("plain", streams_weights=False, threads=False, compile_options=frozenset())
    with pytest.raises(SessionError, match=r"the plain backend cannot run llama\.gguf with n_threads=1: it has no "
                                           r"thread pool .*; budget_bytes=1000000: it does not stream weights "
                                           r".*; gemm='f32': not among its compile options \(none\)"):
        Session(model, device="plain", n_threads=1, budget_bytes=1_000_000, gemm="f32", **OPTS)
    with Session(model, device="plain", **OPTS) as s:  # nothing undeclared asked: it runs
        assert s.generate(IDS, max_new_tokens=2, ignore_eos=True).tokens


def test_a_streaming_backend_of_any_name_streams_under_a_budget(model: Path, reference: Any, plugin: Any) -> None:
    """The budget's streaming setup follows ``streams_weights`` (it used to be given to a backend named "cpu"
    only: any other name mapped every weight and left the budget unenforced)."""
    weight_bytes, tokens = reference
    plugin("gpu-x", kind="gpu")
    with Session(model, device="gpu-x", budget_bytes=weight_bytes // 2, **OPTS) as s:
        assert s.backend is not None and s.backend.name == "gpu-x"
        assert s.storage_stats()["mode"] == "streaming" and s.streaming
        assert list(s.generate(IDS, max_new_tokens=6, ignore_eos=True).tokens) == tokens


# --- the executable's own numbers against the budget -----------------------------------------------------------------
def test_a_backend_allocating_more_than_the_plan_counts_gets_a_smaller_plan(model: Path, reference: Any,
                                                                            plugin: Any) -> None:
    weight_bytes, tokens = reference
    budget = weight_bytes // 2
    with Session(model, budget_bytes=budget, **OPTS) as s:
        first = s.plan.storage.pinned_bytes
        mem = s._exe.memory()
        assert mem.total + s._kv.nbytes <= budget
    extra = 256 << 10
    plugin("heavy", extra=extra)
    with Session(model, device="heavy", budget_bytes=budget, **OPTS) as s:
        assert s.plan.storage.pinned_bytes < first  # planned again for the budget less what the plan missed
        assert s._exe.memory().total + s._kv.nbytes <= budget
        assert list(s.generate(IDS, max_new_tokens=6, ignore_eos=True).tokens) == tokens
    plugin("heavier", extra=budget)
    with pytest.raises(BudgetError, match=rf"\[runtime\] memory budget of {budget} bytes is too small: the heavier "
                                          r"executable allocates \d+ bytes beyond what the plan counts"):
        Session(model, device="heavier", budget_bytes=budget, **OPTS)


class _Exe:
    def __init__(self, mem: ExecutableMemory) -> None:
        self.mem = mem

    def memory(self) -> ExecutableMemory:
        return self.mem


def test_device_memory_is_checked_against_the_declared_device_memory() -> None:
    """A device executable's bytes are the device's: held to ``capabilities.device_memory``, not to the host
    budget; a host executable without an enforced budget is not checked."""
    dev = Plugin("dev", device_memory=1000)
    o = SessionOptions(budget_bytes=10)
    assert check_memory(dev, _Exe(ExecutableMemory(600, 300, device="device")), None, o, None, enforced=True) == 0
    with pytest.raises(BudgetError, match=r"dev device memory of 1000 bytes is too small: the dev executable "
                                          r"allocates arena 600 \+ weights 300 \+ staging 200 \+ kv cache 0 = 1100"):
        check_memory(dev, _Exe(ExecutableMemory(600, 300, 200, device="device")), None, o, None, enforced=True)
    host = ExecutableMemory(600, 300, 200)
    assert check_memory(dev, _Exe(host), None, o, None, enforced=False) == 0
    with pytest.raises(BudgetError, match=r"memory budget of 10 bytes is too small"):
        check_memory(dev, _Exe(host), None, o, None, enforced=True)


# --- KV bytes and the plan's prefetch order ----------------------------------------------------------------------
def test_kv_cache_bytes_count_the_cached_attention_layers_by_structure() -> None:
    """Caches named freely count (the budget used to count graph inputs named past_k.* / past_v.*); an input of
    that name that no cached Attention reads does not."""
    t = [Tensor(n, DType.F32, ("seq", 2, 8)) for n in ("q", "k", "v", "y")]
    t += [Tensor("keys", DType.F32, ("past", 2, 8)), Tensor("vals", DType.F32, ("past", 2, 8)),
          Tensor("past_k.9", DType.F32, ("past", 2, 8))]
    g = make_graph("att", [Node("a", "Attention", ("q", "k", "v", "keys", "vals"), ("y",))], t,
                   ["q", "k", "v", "keys", "vals", "past_k.9"], ["y"])
    assert kv_cache_bytes(g, 10) == 10 * 2 * (8 + 8) * 4 and kv_cache_bytes(g, 10, "f16") == 10 * 2 * 16 * 2


def test_the_streamer_follows_the_plans_prefetch_order(model: Path, reference: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The Session hands the plan's storage plan to the backend; a plan whose prefetch order is reversed is the
    order the streamer queues its reads in (the tokens do not change)."""
    import uaii.runtime.session as session_module

    weight_bytes, tokens = reference
    real = session_module.session_plan

    def reversed_order(*args: Any, **kw: Any) -> Any:
        plan, hit = real(*args, **kw)
        return replace(plan, storage=replace(plan.storage, prefetch_order=plan.storage.prefetch_order[::-1])), hit

    monkeypatch.setattr(session_module, "session_plan", reversed_order)
    with Session(model, budget_bytes=weight_bytes // 3, **OPTS) as s:
        order = list(s.plan.storage.prefetch_order)
        assert s.streaming and len(order) > 2 and order[0].endswith("blk.5.ffn_down.weight")  # the last first
        staged = [r for r in order if not r.endswith("token_embd.weight")]  # looked up by rows, never staged
        assert list(dict.fromkeys(r.partition("@rows=")[0] for r in s._exe.streaming.order)) == staged
        assert s.plan.planned_bytes <= weight_bytes // 3
        assert list(s.generate(IDS, max_new_tokens=6, ignore_eos=True).tokens) == tokens
