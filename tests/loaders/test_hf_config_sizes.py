"""Sizes in config.json are checked against the tensors (and sane limits) before anything per layer is built.

A config is small and its numbers are cheap to write: ``num_hidden_layers: 1e9`` once cost 7.8 GB of
per-layer tuples before any check, a config with fewer layers than the checkpoint silently dropped the rest,
and a wrong ``vocab_size`` was overridden without a word. Each case names the key, its value and what the
checkpoint holds.
"""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc
from pathlib import Path
from typing import Any

import loader_helpers as H
import pytest

from uaii.loaders import LoaderError, from_hf, load_model

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sizes")
    return {arch: H.save_tiny(arch, root / arch) for arch in ("llama", "mixtral", "qwen2moe", "gpt2", "phi3")}


def _with_config(src: Path, dst: Path, **changes: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _bounded(fn: Any, seconds: float = 1.0, mbytes: float = 50.0) -> Exception:
    """Run fn, expecting a LoaderError, within the time and allocation bounds; return the error."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(LoaderError) as info:
            fn()
        elapsed, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < seconds, f"took {elapsed:.2f} s"
    assert peak < mbytes * 2**20, f"allocated {peak / 2**20:.0f} MiB"
    return info.value


@pytest.mark.parametrize("layers", [10**8, 10**9])
def test_a_billion_layers_fail_fast(tiny: dict[str, Path], tmp_path: Path, layers: int) -> None:
    d = _with_config(tiny["llama"], tmp_path / "m", num_hidden_layers=layers)
    err = _bounded(lambda: load_model(d))
    assert f"num_hidden_layers = {layers}" in str(err) and "2 layers" in str(err)
    assert str(d / "config.json") in str(err)


def test_a_billion_experts_fail_fast(tiny: dict[str, Path], tmp_path: Path) -> None:
    d = _with_config(tiny["mixtral"], tmp_path / "m", num_local_experts=10**9)
    err = _bounded(lambda: load_model(d))
    assert "num_local_experts = 1000000000" in str(err) and "4 experts" in str(err)


def test_from_hf_alone_bounds_sizes_before_building_per_layer() -> None:
    cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 10**9,
           "vocab_size": 10, "sliding_window": 16}
    err = _bounded(lambda: from_hf(cfg, "c.json"))
    assert "num_hidden_layers = 1000000000 is more than the 4096 that any model has" in str(err)


@pytest.mark.parametrize("arch, changes, message", [
    ("llama", {"num_hidden_layers": 1}, r"num_hidden_layers = 1, but the checkpoint holds 2 layers"),
    ("llama", {"num_hidden_layers": 3}, r"num_hidden_layers = 3, but the checkpoint holds 2 layers"),
    ("llama", {"vocab_size": 128}, r"vocab_size = 128, but the embedding .* holds 64 rows"),
    ("llama", {"hidden_size": 64, "head_dim": 8}, r"hidden_size = 64, but .*embed_tokens.weight.* \[64, 32\]"),
    ("llama", {"num_key_value_heads": 4},
     r"num_key_value_heads = 4, but .*k_proj.weight' has shape \[16, 32\], not 32 rows"),
    ("llama", {"num_attention_heads": 2, "head_dim": 8},
     r"num_attention_heads = 2, but .*q_proj.weight' has shape \[32, 32\], not 16 rows"),
    ("llama", {"intermediate_size": 128}, r"intermediate_size = 128, but .*up_proj.weight.* \[64, 32\]"),
    ("phi3", {"intermediate_size": 128}, r"intermediate_size = 128, but .*gate_up_proj.weight.* \[128, 32\]"),
    ("mixtral", {"num_local_experts": 8}, r"num_local_experts = 8, but the checkpoint holds 4 experts"),
    ("qwen2moe", {"moe_intermediate_size": 16}, r"moe_intermediate_size = 16, but .*experts.0.up_proj"),
    ("qwen2moe", {"shared_expert_intermediate_size": 32},
     r"shared_expert_intermediate_size = 32, but .*shared_expert.up_proj"),
    ("gpt2", {"n_positions": 4096}, r"n_positions = 4096, but .*wpe.weight.* \[128, 32\]"),
    ("gpt2", {"n_layer": 5}, r"n_layer = 5, but the checkpoint holds 2 layers"),
])
def test_sizes_are_checked_against_the_tensors(tiny: dict[str, Path], tmp_path: Path, arch: str,
                                               changes: dict[str, Any], message: str) -> None:
    d = _with_config(tiny[arch], tmp_path / "m", **changes)
    with pytest.raises(LoaderError, match=message):
        load_model(d)


@pytest.mark.parametrize("changes, message", [
    ({"num_attention_heads": 0}, r"'num_attention_heads' must be at least 1, found 0"),
    ({"sliding_window_pattern": 0}, r"'sliding_window_pattern' must be at least 1, found 0"),
    ({"layer_types": ["sliding_attention"] * 3}, r"3 layer_types for 2 layers"),
    ({"model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "mlp_only_layers": ["0"]}, r"'mlp_only_layers' must be a list of layer numbers, found \['0'\]"),
    ({"max_position_embeddings": 2**40},
     r"max_position_embeddings = 1099511627776 is more than the 16777216 that any model has"),
])
def test_degenerate_sizes_are_errors_not_crashes(changes: dict[str, Any], message: str) -> None:
    cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 10, "sliding_window": 16, **changes}
    with pytest.raises(LoaderError, match=message):
        from_hf(cfg, "c.json")


def test_an_oversized_config_json_is_not_parsed(tiny: dict[str, Path], tmp_path: Path) -> None:
    """config.json is read only up to 16 MiB: a 100 MB one (the old bound) cost gigabytes of Python objects."""
    from uaii.ir import FormatError

    d = _with_config(tiny["llama"], tmp_path / "m")
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text[:-1] + " " * (17 << 20) + "}")
    with pytest.raises(FormatError, match=r"config\.json is larger than 16777216 bytes"):
        load_model(d)
