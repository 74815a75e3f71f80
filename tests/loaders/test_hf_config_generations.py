"""config.json as transformers 4.x and 5.x write it: one ModelConfig, the logits transformers computes.

transformers 5 moved RoPE into ``rope_parameters`` (gemma3: one block per attention type). The fixtures in
``fixtures/hf_configs/{v4,v5}`` were saved by both generations from the same variants (see hf_generations.py);
each pair must normalize alike, to the RoPE transformers uses, and the 5.x file must make a checkpoint saved by
transformers 4.57 compute 4.57's logits. What UAII does not implement is refused with the file and key named.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import hf_generations as G
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.ir.reference import evaluate
from uaii.loaders import LoadedModel, LoaderError, from_hf, load_model

WHERE = "/models/tiny/config.json"
_YARN_ATTN = 0.1 * math.log(4.0) + 1.0

# What transformers builds from each variant (modeling_rope_utils): theta, scaling and its parameters.
EXPECTED: dict[str, dict[str, Any] | None] = {
    "llama": {"theta": 5e5, "scaling": "none", "dims": 8},
    "llama_llama3": {"theta": 5e5, "scaling": "llama3", "factor": 8.0, "original_context": 64,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "llama_linear": {"theta": 5e5, "scaling": "linear", "factor": 2.0},
    "llama_yarn": {"theta": 1e4, "scaling": "yarn", "factor": 4.0, "original_context": 32,
                   "attn_factor": _YARN_ATTN, "beta_fast": 32.0, "beta_slow": 1.0},
    "mistral": {"theta": 1e6, "scaling": "none"},
    "qwen2": {"theta": 1e6, "scaling": "none"},
    "qwen2_yarn": {"theta": 1e4, "scaling": "yarn", "factor": 4.0, "original_context": 32,
                   "attn_factor": _YARN_ATTN},
    "qwen3": {"theta": 1e6, "scaling": "none", "dims": 16},
    "qwen3_yarn": {"theta": 1e6, "scaling": "yarn", "factor": 4.0, "original_context": 32},
    "gemma3": {"theta": 1e6, "local_theta": 1e4, "scaling": "none", "dims": 16},
    "gemma3_linear": {"theta": 1e6, "local_theta": 2e4, "scaling": "linear", "factor": 8.0},
    "gemma3_multimodal": {"theta": 1e6, "local_theta": 1e4, "scaling": "linear", "factor": 8.0},
    "phi3": {"theta": 1e4, "scaling": "none", "dims": 4},
    "phi3_longrope": {"theta": 1e4, "scaling": "longrope", "dims": 4, "original_context": 8,
                      "attn_factor": math.sqrt(1 + math.log(512 / 8) / math.log(8)),
                      "short_factors": (1.0, 1.5), "long_factors": (2.0, 4.0)},
    "mixtral": {"theta": 1e6, "scaling": "none"},
    "qwen2moe": {"theta": 1e6, "scaling": "none"},
    "qwen3moe": {"theta": 1e6, "scaling": "none"},
    "gpt2": None,
    "bert": None,
}
ACCEPTED = sorted(set(G.VARIANTS) - G.REFUSED)


def test_every_variant_has_fixtures_and_expectations() -> None:
    assert set(EXPECTED) == set(ACCEPTED)
    for gen in G.GENERATIONS:
        assert sorted(p.stem for p in (G.FIXTURES / gen).glob("*.json")) == sorted(G.VARIANTS)
        assert all(G.fixture(gen, n)["transformers_version"].startswith(gen[1]) for n in G.VARIANTS)


@pytest.mark.parametrize("name", ACCEPTED)
def test_generations_normalize_alike(name: str) -> None:
    v4, v5 = (from_hf(G.fixture(gen, name), WHERE) for gen in G.GENERATIONS)
    assert v4 == v5
    want = EXPECTED[name]
    if want is None:
        assert v5.rope is None
        return
    assert v5.rope is not None
    got = {k: getattr(v5.rope, k) for k in want}
    assert got == pytest.approx(want), name


def test_transformers5_reads_moe_expert_counts_under_their_new_name() -> None:
    v5 = G.fixture("v5", "qwen3moe")
    assert "num_local_experts" in v5 and "num_experts" not in v5  # what 5.x writes for qwen3-moe
    assert from_hf(v5, WHERE).n_experts == 4


# --- logits: a checkpoint saved by transformers 4.57, read through the 5.x config.json ----------------------------
def _weight(m: LoadedModel, t: Any) -> np.ndarray:
    if str(t.weight) in m.weights.virtual_banks:
        return np.stack([m.weights.read_numpy(t.weight.with_expert(e)) for e in range(t.shape[0])])
    return m.weights.read_numpy(t.weight).reshape(t.shape)


def _our_logits(m: LoadedModel, tokens: np.ndarray) -> np.ndarray:
    feeds = {"tokens": tokens, "positions": np.arange(len(tokens), dtype=np.int64)}
    for name in m.graph.inputs:
        if name.startswith("past_"):
            feeds[name] = np.zeros((0, *(int(x) for x in m.graph.tensor(name).shape[1:])), dtype=np.float32)
    out = evaluate(m.graph, feeds, lambda t: _weight(m, t).astype(np.float32))
    return np.asarray(out["logits"])


TOKENS = np.array([3, 17, 5, 9, 22, 40, 1, 8, 63, 30, 12, 7, 44, 2, 19, 50], dtype=np.int64)
LOGIT_VARIANTS = sorted(n for n in ACCEPTED if G.VARIANTS[n][1] is not None and n != "bert")


@pytest.fixture(scope="module")
def saved_v4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray]]:
    """Each variant saved by the workspace's transformers 4.57, with the logits 4.57 computes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not transformers.__version__.startswith("4."):
        pytest.skip("the reference logits come from transformers 4.x")
    root = tmp_path_factory.mktemp("generations")
    out = {}
    for name in LOGIT_VARIANTS:
        d = G.save_variant(name, root / name)
        model = getattr(transformers, G.VARIANTS[name][1]).from_pretrained(d, attn_implementation="eager")
        with torch.no_grad():
            out[name] = (d, model.eval()(torch.from_numpy(TOKENS)[None]).logits[0].numpy())
    return out


def test_fixtures_are_what_the_variants_save(saved_v4: dict[str, tuple[Path, np.ndarray]]) -> None:
    """A changed variant (or loader_helpers.TINY) needs new fixtures: scripts/gen_hf_config_fixtures.py."""
    for name, (d, _) in saved_v4.items():
        saved = json.loads((d / "config.json").read_text())
        fixed = G.fixture("v4", name)
        assert {**saved, "transformers_version": ""} == {**fixed, "transformers_version": ""}, name


@pytest.mark.parametrize("gen", G.GENERATIONS)
@pytest.mark.parametrize("name", LOGIT_VARIANTS)
def test_config_generation_gives_transformers_logits(saved_v4: dict[str, tuple[Path, np.ndarray]], name: str,
                                                     gen: str, tmp_path: Path) -> None:
    src, want = saved_v4[name]
    d = tmp_path / name
    d.mkdir()
    (d / "model.safetensors").symlink_to(src / "model.safetensors")
    (d / "config.json").write_text(json.dumps(G.fixture(gen, name)))
    m = load_model(d)
    np.testing.assert_allclose(_our_logits(m, TOKENS), want, rtol=1e-5, atol=1e-5, err_msg=f"{gen}/{name}")


# --- what is refused -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gen", G.GENERATIONS)
def test_dynamic_ntk_is_refused_in_both_generations(gen: str) -> None:
    with pytest.raises(LoaderError, match=r"/models/tiny/config\.json.*rope scaling 'dynamic' is not supported"):
        from_hf(G.fixture(gen, "llama_dynamic"), WHERE)


def _v5(name: str, **changes: Any) -> dict[str, Any]:
    cfg = G.fixture("v5", name)
    cfg.update(changes)
    return cfg


@pytest.mark.parametrize("config, message", [
    (_v5("llama_llama3", rope_parameters={**G.fixture("v5", "llama_llama3")["rope_parameters"], "foo": 1}),
     r"rope_parameters: unknown key 'foo' for rope type 'llama3'"),
    (_v5("llama", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}),
     r"rope_parameters: unknown key 'factor' for rope type 'default'"),
    (_v5("llama", rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}),
     r"rope_parameters: rope scaling 'proportional' is not supported"),
    (_v5("llama_yarn", rope_parameters={**G.fixture("v5", "llama_yarn")["rope_parameters"], "truncate": False}),
     r"rope_parameters: yarn with 'truncate': false is not supported"),
    (_v5("llama_linear", rope_parameters={"rope_type": "linear", "rope_theta": 1e4}),
     r"rope_parameters: rope type 'linear' needs 'factor'"),
    (_v5("llama", rope_parameters={"rope_type": "linear", "type": "yarn", "factor": 2.0}),
     r"rope_parameters: 'rope_type' is 'linear' but 'type' is 'yarn'"),
    (_v5("llama", rope_theta=1e4),
     r"'rope_theta' = 10000.0 at the top level but 500000.0 in rope_parameters"),
    (_v5("llama_llama3", original_max_position_embeddings=16),
     r"'original_max_position_embeddings' = 16 at the top level but 64 in rope_parameters"),
    (_v5("gemma3", rope_parameters={"full_attention": {"rope_type": "default"},
                                    "sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
     r"rope_parameters.sliding_attention: sliding-window layers take plain RoPE.*found 'linear'"),
    (_v5("gemma3", rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
     r"gemma3 needs one rope_parameters block per attention type"),
    (_v5("gemma3", rope_parameters={"full_attention": {"rope_type": "default"}, "rope_theta": 1e6}),
     r"rope_parameters mixes blocks per attention type \(full_attention\) with settings \('rope_theta'\)"),
    (_v5("llama", rope_parameters={"full_attention": {"rope_type": "default"},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 5.0}},
         layer_types=["full_attention", "sliding_attention"]),
     r"llama layers take one RoPE; rope_parameters differ between full_attention and sliding_attention"),
    (_v5("llama", rope_parameters=[1, 2]), r"'rope_parameters' must be a JSON object, found \[1, 2\]"),
    (_v5("qwen3", rope_interleave=True), r"unknown RoPE setting 'rope_interleave'"),
    (_v5("llama", rope_local_base_freq=1e4), r"unknown RoPE setting 'rope_local_base_freq' for llama"),
    (_v5("gemma3", use_bidirectional_attention=True), r"use_bidirectional_attention"),
    (_v5("bert", position_embedding_type="relative_key"), r"position_embedding_type 'relative_key'"),
])
def test_what_is_not_understood_is_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(LoaderError, match=re.escape(WHERE) + ".*" + message):
        from_hf(config, WHERE)


# --- property: any RoPE block means the same in both spellings ---------------------------------------------------
_KINDS = {
    "default": {},
    "linear": {"factor": st.floats(1.0, 64.0)},
    "llama3": {"factor": st.floats(1.0, 64.0), "low_freq_factor": st.floats(0.5, 2.0),
               "high_freq_factor": st.floats(2.5, 8.0), "original_max_position_embeddings": st.integers(8, 4096)},
    "yarn": {"factor": st.floats(1.0, 64.0), "original_max_position_embeddings": st.integers(8, 4096),
             "beta_fast": st.floats(8.0, 64.0), "beta_slow": st.floats(0.5, 4.0),
             "attention_factor": st.floats(0.5, 2.0), "mscale": st.floats(0.5, 2.0),
             "mscale_all_dim": st.floats(0.5, 2.0)},
}


@st.composite
def _rope_settings(draw: st.DrawFn) -> tuple[float, dict[str, Any]]:
    kind = draw(st.sampled_from(sorted(_KINDS)))
    optional = st.sampled_from([True, False])
    block: dict[str, Any] = {"rope_type": kind}
    for key, values in _KINDS[kind].items():
        if kind != "yarn" or key == "factor" or draw(optional):
            block[key] = draw(values)
    return draw(st.floats(100.0, 1e7)), block


@settings(max_examples=150, deadline=None)
@given(_rope_settings(), st.sampled_from([0.5, 1.0]), st.sampled_from(["llama", "qwen2", "mixtral", "qwen3"]))
def test_both_spellings_of_random_rope_settings_agree(rope: tuple[float, dict[str, Any]], partial: float,
                                                     arch: str) -> None:
    theta, block = rope
    base = {"model_type": arch, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 10, "max_position_embeddings": 8192, "num_experts": 4, "num_local_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    v4 = from_hf({**base, "rope_theta": theta, "partial_rotary_factor": partial, "rope_scaling": block}, WHERE)
    v5 = from_hf({**base, "rope_parameters": {**block, "rope_theta": theta, "partial_rotary_factor": partial}},
                 WHERE)
    assert v4 == v5 and v5.rope is not None
    assert v5.rope.theta == theta and v5.rope.dims == int(16 * partial)
    assert v5.rope.scaling == {"default": "none"}.get(block["rope_type"], block["rope_type"])


@settings(max_examples=150, deadline=None)
@given(_rope_settings(), st.text(min_size=1, max_size=12))
def test_any_key_outside_a_types_table_is_refused(rope: tuple[float, dict[str, Any]], key: str) -> None:
    theta, block = rope
    known = {"rope_type", "type", "rope_theta", "partial_rotary_factor", *_KINDS[block["rope_type"]]}
    known |= {"truncate"} if block["rope_type"] == "yarn" else set()
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "vocab_size": 10, "max_position_embeddings": 8192}
    config = {**base, "rope_parameters": {**block, "rope_theta": theta, key: 1.0}}
    if key in known:
        return
    with pytest.raises(LoaderError, match=f"unknown key {re.escape(repr(key))}"):
        from_hf(config, WHERE)
