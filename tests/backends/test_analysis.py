"""What both backends derive alike (backends/analysis.py, base.py): the KV layout they bind by, the feed shapes a
compile-time binding and a plan's arena are made at, the check of a plan's arena, and the backend contract's
device listing and software opt-in (so that the runtime names no backend's modules)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from uaii.backends import BackendUnavailable, get_backend
from uaii.backends.analysis import KvLayout, feed_types, kv_layout, token_shapes
from uaii.backends.base import BackendError, arena_problems, check_plan_arena
from uaii.backends.config import ALLOW_SOFTWARE_ENV
from uaii.backends.registry import allow_software_devices
from uaii.ir import DType, Node, Tensor, make_graph
from uaii.ir.kvcache import kv_layers
from uaii.ir.plan import ArenaLayout, BufferSlot

H, HQ, D = 2, 4, 8


def _graph() -> object:
    """One cached attention layer (past/present as graph inputs/outputs) and one that computes a batch dim."""
    t = [Tensor("q", DType.F32, ("seq", HQ, D)), Tensor("k", DType.F32, ("seq", H, D)),
         Tensor("v", DType.F32, ("seq", H, D)), Tensor("pk", DType.F16, ("past", H, D)),
         Tensor("pv", DType.F16, ("past", H, 2 * D)), Tensor("y", DType.F32, ("seq", HQ, 2 * D)),
         Tensor("nk", DType.F16, ("all", H, D)), Tensor("nv", DType.F16, ("all", H, 2 * D)),
         Tensor("b", DType.F32, ("batch", 3))]
    node = Node("attn", "Attention", ("q", "k", "v", "pk", "pv"), ("y", "nk", "nv"), {"n_heads": HQ, "n_kv_heads": H})
    return make_graph("kv", [node], t, ["q", "k", "v", "pk", "pv", "b"], ["y", "nk", "nv"])


def test_the_kv_layout_is_the_irs_analysis_arranged_for_binding() -> None:
    g = _graph()
    kv = kv_layout(g)
    assert kv.layers == tuple(kv_layers(g))  # type: ignore[arg-type]
    assert kv.layer == {"attn": 0} and kv.dims == [(H, D, 2 * D)] and kv.values == {"pk", "pv", "nk", "nv"}
    past = kv.past_types(g.tensor_map)  # type: ignore[attr-defined]
    assert {n: (t.dtype, t.shape) for n, t in past.items()} == {"pk": (DType.F16, (0, H, D)),
                                                                  "pv": (DType.F16, (0, H, 2 * D))}
    assert not KvLayout().layers and KvLayout().values == frozenset()
    types = feed_types(g, ["q", "b"], {"q": (5, HQ, D), "b": (2, 3)}, kv)  # type: ignore[arg-type]
    assert types["q"].shape == (5, HQ, D) and types["b"].shape == (2, 3) and types["pk"].shape == (0, H, D)


def test_token_shapes_bind_every_symbolic_dim_or_only_token_batched_graphs() -> None:
    g = _graph()
    assert token_shapes(g, ["q", "k"], 7, batched_only=True) == {"q": (7, HQ, D), "k": (7, H, D)}  # type: ignore[arg-type]
    assert token_shapes(g, ["q", "b"], 7, batched_only=True) is None  # type: ignore[arg-type]
    assert token_shapes(g, ["q", "b"], 7, batched_only=False) == {"q": (7, HQ, D), "b": (7, 3)}  # type: ignore[arg-type]


def _arena(*slots: BufferSlot, size: int = 512, rule: str = "r/1", alignment: int = 64) -> ArenaLayout:
    return ArenaLayout(size=size, alignment=alignment, max_tokens=4, slots=slots, rule=rule)


A, B = BufferSlot("a", 0, 100, "f32", 0, 1), BufferSlot("b", 128, 100, "f32", 1, 2)


@pytest.mark.parametrize(("arena", "want"), [
    (_arena(A, B), None),
    (_arena(A, B, rule="other/1"), "laid out by the 'other/1' rule, not 'r/1'"),
    (_arena(A, B, alignment=32), "32-aligned, the backend binds buffers at multiples of 64"),
    (_arena(A), "no slot holds buffer 'b'"),
    (_arena(A, BufferSlot("b", 128, 99, "f32", 1, 2)), "slot 'b' has 99 bytes, the buffer needs 100"),
    (_arena(A, BufferSlot("b", 128, 100, "f32", 2, 2)), "slot 'b' is live at steps 2..2, the buffer at 1..2"),
    (_arena(A, BufferSlot("b", 96, 100, "f32", 1, 2)), "slot 'b' at [96, 196) is not 64-aligned inside"),
    (_arena(A, B, size=200), "slot 'b' at [128, 228) is not 64-aligned inside the arena"),
    (_arena(A, B, BufferSlot("c", 256, 4, "f32", 0, 0)), "a slot for 'c', which is no buffer of this executable"),
    (_arena(A, BufferSlot("b", 0, 100, "f32", 1, 2)), "slots 'a' and 'b' are live at the same step and share"),
])
def test_arena_problems_is_one_check_for_every_backend(arena: ArenaLayout, want: str | None) -> None:
    got = next(arena_problems(arena, [replace_offset(A), replace_offset(B)], rule="r/1", align=64), None)
    assert got is None if want is None else want in (got or "")


def replace_offset(s: BufferSlot) -> BufferSlot:
    """The wanted slot: offsets are the plan's, not the backend's."""
    return BufferSlot(s.value, 999, s.nbytes, s.dtype, s.first_step, s.last_step)


def test_check_plan_arena_names_backend_rule_and_tokens() -> None:
    check_plan_arena("x", "r/1", _arena(A), 4)
    with pytest.raises(BackendError, match=r"\[backend\] x cannot run the plan's arena: .*'q/1' rule, not this "
                                           r"backend's 'r/1'"):
        check_plan_arena("x", "r/1", _arena(A, rule="q/1"), 4)
    with pytest.raises(BackendError, match="laid out for 4 tokens, compile asks for 8"):
        check_plan_arena("x", "r/1", _arena(A), 8)


def test_backends_declare_kind_and_list_their_devices_through_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, gpu = get_backend("cpu"), get_backend("webgpu")
    assert (cpu.kind, gpu.kind) == ("cpu", "gpu")
    assert cpu.devices() is None  # no listing beyond its probe
    try:
        rows = gpu.devices()
    except BackendUnavailable as exc:  # no wgpu: the reason is what the listing shows
        assert exc.reason
    else:
        assert all({"index", "name", "software", "usable", "limits", "features"} <= set(r) for r in rows)
    monkeypatch.setenv(ALLOW_SOFTWARE_ENV, "0")
    allow_software_devices()
    assert os.environ[ALLOW_SOFTWARE_ENV] == "1"


def test_the_runtime_names_no_backends_modules() -> None:
    """The runtime reaches backends through the contract and the registry (uaii.backends, .base, .registry,
    .config), never through one backend's modules (uaii.backends.webgpu.device, uaii.backends.cpu...)."""
    root = Path(__file__).resolve().parents[2] / "packages" / "uaii-runtime" / "src"
    named = [f"{p.relative_to(root)}: {line.strip()}" for p in root.rglob("*.py")
             for line in p.read_text(encoding="utf-8").splitlines()
             if re.search(r"uaii\.backends\.(cpu|webgpu|gpu)\b", line)]
    assert named == []
