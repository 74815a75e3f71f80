"""How an mlx-lm checkpoint's quantization is read (uaii.loaders.mlx): config.json's ``quantization`` (defaults and
per-module overrides), every module's parameters checked against its tensors, and clear errors where the two
disagree. No mlx needed: the tensors here are headers only."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from uaii.ir import DType
from uaii.ir.ops.quantized import check_layout
from uaii.loaders import LoaderError
from uaii.loaders.index import TensorInfo
from uaii.loaders.mlx import MlxQuantization, QuantParams, refuse_unsupported

WHERE = "/m/config.json"


def info(name: str, dtype: str, shape: tuple[int, ...]) -> TensorInfo:
    dt = DType.parse(dtype)
    return TensorInfo(name, dt, shape, "/m/model.safetensors", 0, dt.nbytes(math.prod(shape)))


def module(rows: int, cols: int, bits: int, gs: int, scale: str = "f32", biases: bool = True,
           name: str = "model.layers.0.mlp.down_proj") -> tuple[TensorInfo, TensorInfo, TensorInfo | None]:
    return (info(f"{name}.weight", "u32", (rows, cols * bits // 32)),
            info(f"{name}.scales", scale, (rows, cols // gs)),
            info(f"{name}.biases", scale, (rows, cols // gs)) if biases else None)


def quant(config: dict[str, Any]) -> MlxQuantization:
    q = MlxQuantization.from_config(config, WHERE)
    assert q is not None
    return q


def test_no_quantization_and_another_tools_config_are_not_mlx() -> None:
    assert MlxQuantization.from_config({}, WHERE) is None
    assert MlxQuantization.from_config({"quantization_config": {"quant_method": "gptq", "bits": 4}}, WHERE) is None
    q = quant({"quantization_config": {"group_size": 32, "bits": 8}})  # the mirror alone, as some uploads have it
    assert q.default == QuantParams("affine", 8, 32)


def test_defaults_and_overrides() -> None:
    q = quant({"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
                                "model.layers.0.mlp.up_proj": False,
                                "lm_head": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}})
    assert q.default == QuantParams("affine", 4, 64)
    assert q.modules["model.layers.0.mlp.up_proj"] is None
    got = q.for_module("model.layers.0.mlp.down_proj", *module(16, 256, 8, 32))
    assert (got.params, got.cols) == (QuantParams("affine", 8, 32), 256)
    got = q.for_module("model.layers.0.self_attn.q_proj", *module(16, 128, 4, 64, name="q"))
    assert (got.params, got.cols) == (QuantParams("affine", 4, 64), 128)


@pytest.mark.parametrize("mode,bits,gs", [("mxfp4", 4, 32), ("mxfp8", 8, 32), ("nvfp4", 4, 16)])
def test_fp_modes_are_told_apart_by_their_tensors(mode: str, bits: int, gs: int) -> None:
    """An unnamed module with uint8 scales: each fp mode has one (bits, group) pair, so words per group say which
    (mlx_lm.utils.infer_quant_config's rule); the default's mode does not matter."""
    q = quant({"quantization": {"group_size": 64, "bits": 4}})
    got = q.for_module("m", *module(8, 128, bits, gs, scale="u8", biases=False))
    assert (got.params, got.cols) == (QuantParams(mode, bits, gs), 128)


def test_an_unnamed_affine_module_takes_its_bits_from_its_tensors() -> None:
    """Not named in the map: the default group size, and the bits the packed width says (mlx-lm's rule)."""
    q = quant({"quantization": {"bits": 4, "group_size": 64}})
    assert q.for_module("m", *module(8, 128, 8, 64)).params == QuantParams("affine", 8, 64)


@pytest.mark.parametrize("entry,tensors,match", [
    ({"bits": 4, "group_size": 32}, module(8, 128, 4, 64, name="m"),
     r"module 'm' \(affine, 4 bits, groups of 32\) does not fit its tensors"),
    (False, module(8, 128, 4, 64, name="m"), r"is false \(left in float\)"),
    (None, module(8, 128, 4, 64, biases=False, name="m"), "affine needs biases"),
    ({"mode": "mxfp4", "group_size": 32, "bits": 4}, module(8, 128, 4, 32, name="m"), "mxfp4 scales are uint8"),
    (None, (module(8, 128, 4, 32, name="m")[0], info("m.scales", "u8", (8, 5)), None),
     r"fit none of mxfp4, mxfp8, nvfp4"),
])
def test_modules_that_do_not_fit_their_tensors_are_named(entry: Any, tensors: Any, match: str) -> None:
    config: dict[str, Any] = {"bits": 4, "group_size": 64}
    if entry is not None:
        config["m"] = entry
    with pytest.raises(LoaderError, match=match):
        quant({"quantization": config}).for_module("m", *tensors)


def test_packed_weight_must_be_uint32_and_agree_with_scales() -> None:
    q = quant({"quantization": {"bits": 4, "group_size": 64}})
    w, s, b = module(8, 128, 4, 64)
    with pytest.raises(LoaderError, match="must be packed uint32; found f32"):
        q.for_module("m", info("m.weight", "f32", w.shape), s, b)
    with pytest.raises(LoaderError, match="must agree in all but the last dimension"):
        q.for_module("m", w, info("m.scales", "f32", (9, 2)), b)
    with pytest.raises(LoaderError, match="scales are i32; MLX writes float32"):
        q.for_module("m", w, info("m.scales", "i32", s.shape), b)
    with pytest.raises(LoaderError, match=r"biases f16 .* differ from scales"):
        q.for_module("m", w, s, info("m.biases", "f16", (8, 2)))


@pytest.mark.parametrize("entry,match", [
    ({"bits": 7, "group_size": 64}, "affine takes bits 1, 2, 3, 4, 5, 6, 8, not 7"),
    ({"bits": 4, "group_size": 48}, "affine takes group sizes 32, 64, 128, not 48"),
    ({"bits": 8, "group_size": 32, "mode": "mxfp4"}, "mxfp4 takes bits 4, not 8"),
    ({"bits": 4, "group_size": 64, "mode": "int4"}, "mode 'int4' is not one of"),
    ({"bits": "4", "group_size": 64}, "must be integers"),
    ({"bits": True, "group_size": 64}, "must be integers"),
])
def test_bad_configs_name_the_key(entry: dict[str, Any], match: str) -> None:
    with pytest.raises(LoaderError, match=match):
        MlxQuantization.from_config({"quantization": entry}, WHERE)
    with pytest.raises(LoaderError, match=r"quantization\['m'\]"):
        MlxQuantization.from_config({"quantization": {"bits": 4, "group_size": 64, "m": entry}}, WHERE)
    with pytest.raises(LoaderError, match="must be an object"):
        MlxQuantization.from_config({"quantization": [4, 64]}, WHERE)


def test_what_mlx_writes_and_uaii_does_not_run_is_named() -> None:
    with pytest.raises(LoaderError, match="quantize_activations is set"):
        refuse_unsupported({"quantize_activations": True}, [], WHERE)
    with pytest.raises(LoaderError, match=r"'model.layers.0.mlp.switch_mlp.up_proj.global_scale' is an nvfp4 global"):
        refuse_unsupported({}, ["a.weight", "model.layers.0.mlp.switch_mlp.up_proj.global_scale"], WHERE)
    refuse_unsupported({"quantize_activations": False}, ["a.weight", "a.scales"], WHERE)


_json = st.recursive(st.none() | st.booleans() | st.integers(-300, 300) | st.floats(allow_nan=True)
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_entry = st.fixed_dictionaries({}, optional={"group_size": st.sampled_from([16, 32, 48, 64, 128, 0, -1]) | _json,
                                             "bits": st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 16]) | _json,
                                             "mode": st.sampled_from(["affine", "mxfp4", "mxfp8", "nvfp4"]) | _json})


@settings(max_examples=400, deadline=None)
@given(top=_entry, modules=st.dictionaries(st.text(max_size=12), _entry | st.booleans() | _json, max_size=4),
       mirror_only=st.booleans())
def test_any_config_is_read_or_refused_with_a_loader_error(top: dict[str, Any], modules: dict[str, Any],
                                                          mirror_only: bool) -> None:
    """Whatever JSON config.json holds under quantization: a valid reading, or a LoaderError naming config.json."""
    q = {**modules, **top}
    config = {"quantization_config" if mirror_only else "quantization": q}
    try:
        got = MlxQuantization.from_config(config, WHERE)
    except LoaderError as exc:
        assert WHERE in str(exc)
        return
    if got is None:
        assert mirror_only
        return
    for p in (got.default, *(m for m in got.modules.values() if m is not None)):
        assert check_layout(p.mode, p.bits, p.group_size, p.group_size) is None
