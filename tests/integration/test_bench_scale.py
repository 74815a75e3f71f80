"""The plumbing of bench/bench_scale.py's MoE slice (`make bench-scale`): the decode window's expert-cache counters
are the difference of two snapshots, in all and per layer, and the per-token bytes of the slice follow from the
Qwen3-Coder-480B shapes (the 62-layer extrapolation is computed from them). The runs themselves need root and a
14 GB file: `make bench-scale` is the benchmark."""

from __future__ import annotations

import sys

import pytest
from repo_scripts import REPO, load_script

sys.path.insert(0, str(REPO / "bench"))
scale = load_script("bench/bench_scale.py", "bench_scale")


def test_expert_counters_of_the_decode_window_per_layer() -> None:
    before = {"hits": 10, "misses": 30, "bytes_read": 300, "per_layer": {"0": {"hits": 10, "misses": 20,
                                                                              "bytes_read": 200}}}
    after = {"hits": 25, "misses": 35, "bytes_read": 350, "budget_bytes": 1000,
             "per_layer": {"0": {"hits": 18, "misses": 22, "bytes_read": 220},
                           "1": {"hits": 7, "misses": 3, "bytes_read": 30}}}  # layer 1: first seen in the window
    d = scale.expert_delta(before, after)
    assert (d["hits"], d["misses"], d["bytes_read"], d["budget_bytes"]) == (15, 5, 50, 1000)
    assert d["hit_rate"] == pytest.approx(0.75)
    assert d["per_layer"]["0"] == {"hits": 8, "misses": 2, "bytes_read": 20, "hit_rate": pytest.approx(0.8)}
    assert d["per_layer"]["1"]["hit_rate"] == pytest.approx(0.7)
    assert scale.expert_delta(after, after)["hit_rate"] is None            # no routed expert in the window


def test_moe_token_bytes_are_the_slice_shapes_in_q4_0() -> None:
    attn, experts, lm_head = scale.moe_token_bytes()
    m, q = scale.MOE, 18 / 32
    assert attn == (6144 * 96 * 128 * 2 + 6144 * 8 * 128 * 2) * q            # q and o; k and v
    assert experts == 8 * 3 * 6144 * 2560 * q                                # top-8 of gate, up, down
    assert lm_head == 151936 * 6144 * q
    assert (m["n_heads"] * m["head_dim"], m["d_model"]) == (12288, 6144)      # heads apart from d_model
    assert 19.3e9 < scale.MOE_FULL_LAYERS * (attn + experts) + lm_head < 19.5e9
