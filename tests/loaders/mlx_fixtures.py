"""MLX checkpoints written by mlx-lm's own converter, and MLX's logits as their reference (issue #15).

``save_mlx`` saves one of loader_helpers' tiny random models (``save_tiny``), gives it a word-level tokenizer
(``w0`` .. ``w63`` are the ids 0 .. 63; mlx_lm.convert loads and re-saves a tokenizer, and the tiny models have
none), and converts it with ``mlx_lm.convert.convert``: the files are exactly what a user's ``mlx_lm.convert``
writes (model.safetensors with ``{"format": "mlx"}`` metadata, its index, config.json with ``quantization`` and
``quantization_config``, the tokenizer, a model card). ``mlx_logits`` loads the directory with mlx-lm and computes
the logits of one full prefill: the reference the UAII loader is held to.

What MLX writes, per quantized module ``P`` (an ``nn.Linear``, an ``nn.Embedding`` or an MoE ``SwitchLinear``):
``P.weight`` uint32 [..., out, in * bits / 32] (packed little-endian from the lowest bit, values straddle words at
3, 5 and 6 bits), ``P.scales`` [..., out, in / group_size] and, for ``affine`` only, ``P.biases`` of the same shape
(w = scale * q + bias). Affine scales and biases have the model's dtype (``dtype``); mxfp4 / mxfp8 scales are uint8
E8M0 exponents (group 32), nvfp4 scales uint8 FP8 E4M3 (group 16). A module whose input width is not a multiple of
the group size stays in float, and so does one the ``mixed`` predicate returns False for: config.json names neither,
only the absence of ``P.scales`` tells. A per-module dict lands in config.json as ``quantization[P]``.

A few things the converted files differ in from the HF directory they came from: GPT-2's Conv1D weights are stored
transposed to [out, in] under ``model.`` (``model.h.0.attn.c_attn.weight``), Phi-3 keeps its fused ``qkv_proj`` and
``gate_up_proj``, and the MoE experts are stacked into ``switch_mlp.{gate,up,down}_proj`` banks [experts, out, in].
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import loader_helpers as H
import numpy as np

# loader_helpers.TINY's causal LMs that mlx-lm has a model for (bert: none). gemma3 converts to mlx-lm's gemma3_text
# (the model_type Gemma3ForCausalLM saves), mistral to its llama.
ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "mixtral", "qwen2moe", "qwen3moe")

# The modes mlx_lm.convert quantizes to -> its default (bits, group size) (mlx_lm.utils.quantize_model); the fp modes
# allow no other.
MODES = {"affine": (4, 64), "mxfp4": (4, 32), "mxfp8": (8, 32), "nvfp4": (4, 16)}

MixedSpec = str | Mapping[str, "Mapping[str, Any] | bool"]


def word_tokenizer(d: Path, vocab: int = 64) -> None:
    """A word-level tokenizer.json whose words ``w0`` .. ``w{vocab-1}`` are the ids, split on white space, and
    save_tiny's tokenizer files told its class and no special tokens. Otherwise AutoTokenizer picks the model type's
    class (LlamaTokenizerFast), which re-saves the tokenizer with ``<s>`` / ``</s>`` / ``<unk>`` added past the
    vocabulary and a BOS template; and a special ``w1`` would split ``w17`` (added tokens match inside words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (d / "special_tokens_map.json").write_text("{}")


def _widths(arch: str, hidden: int) -> dict[str, Any]:
    if arch == "gpt2":
        return {"n_embd": hidden}  # n_inner: 4 x n_embd
    return {"hidden_size": hidden, "intermediate_size": 2 * hidden, "moe_intermediate_size": hidden,
            "shared_expert_intermediate_size": 2 * hidden}


def save_hf(arch: str, out: Path, *, hidden: int | None = None) -> Path:
    """``save_tiny``'s model as mlx_lm.convert takes it: with a tokenizer, and wider when ``hidden`` is given (the
    tiny models are 32 wide, so a group of 64 or 128 fits only their 64-wide down_proj, or nothing)."""
    import torch
    import transformers

    H.save_tiny(arch, out)
    if hidden is not None:  # the same seed and config but the widths; save_pretrained replaces weights and config
        cfg_name, model_name, kwargs = H.TINY[arch]
        wide = {k: v for k, v in _widths(arch, hidden).items() if k in kwargs}  # no stray keys in config.json
        config = getattr(transformers, cfg_name)(**{**kwargs, **wide})
        torch.manual_seed(H.RNG_SEED)
        getattr(transformers, model_name)(config).eval().save_pretrained(out)
    word_tokenizer(out)
    _as_mlx_lm_expects(arch, out)
    return out


def _as_mlx_lm_expects(arch: str, d: Path) -> None:
    """Two differences between what transformers 4.57 saves and the checkpoints mlx-lm's models are written for, put
    right in the HF directory without changing what transformers computes from it:

    - gemma3: mlx-lm's gemma3_text takes the sliding layers from ``sliding_window_pattern`` (every n-th layer global,
      default 6) and ignores ``layer_types``; Google's configs carry both. The tiny model's layer_types are
      [sliding, full], a pattern of 2.
    - gpt2: mlx-lm's gpt2 reads ``n_ctx`` and the unprefixed names of the original GPT-2 checkpoint (``h.0.attn...``,
      ``wte.weight``, no ``transformer.``, no lm_head: tied). Both are what that checkpoint has; transformers loads it.
    """
    if arch not in ("gemma3", "gpt2"):
        return
    cfg = json.loads((d / "config.json").read_text())
    if arch == "gemma3":
        cfg["sliding_window_pattern"] = 2
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"], cfg["layer_types"]
    else:
        from safetensors.numpy import load_file, save_file

        cfg["n_ctx"] = cfg["n_positions"]
        weights = load_file(d / "model.safetensors")
        save_file({k.removeprefix("transformer."): v for k, v in weights.items() if k != "lm_head.weight"},
                  d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def _predicate(mixed: Mapping[str, Mapping[str, Any] | bool],
               default: dict[str, Any]) -> Callable[[str, Any], bool | dict[str, Any]]:
    """mlx-lm's quant_predicate from {path substring: params or False}: the first key found in a module's path
    decides (a dict: quantized with those bits / group size / mode over the defaults, False: left in float);
    modules no key names get the defaults."""

    def predicate(path: str, module: Any) -> bool | dict[str, Any]:
        for key, params in mixed.items():
            if key in path:
                return {**default, **params} if isinstance(params, Mapping) else bool(params)
        return True

    return predicate


def save_mlx(arch: str, out: Path, *, bits: int | None = None, group_size: int | None = None, mode: str = "affine",
             dtype: str = "float32", mixed: MixedSpec | None = None, hidden: int | None = None,
             quantize: bool = True) -> Path:
    """Convert the tiny ``arch`` model with mlx_lm.convert into ``out`` (which must not exist) and return ``out``.

    ``bits`` / ``group_size`` / ``mode`` as ``mlx_lm.convert -q --q-bits --q-group-size --q-mode`` (default: the
    mode's, MODES); ``dtype`` that of the float tensors and of affine
    scales and biases (``--dtype``); ``mixed`` one of mlx-lm's recipes (``"mixed_3_6"`` ..., ``--quant-predicate``)
    or per-module overrides, e.g. ``{"down_proj": {"bits": 8}, "lm_head": False}``; ``hidden`` a wider model
    (see save_hf); ``quantize=False`` a float conversion."""
    convert = importlib.import_module("mlx_lm.convert")  # `mlx_lm.convert` the attribute is the function

    hf = save_hf(arch, out.parent / f"{out.name}.hf", hidden=hidden)
    bits, group_size = bits or MODES[mode][0], group_size or MODES[mode][1]
    predicate: Any = mixed
    if isinstance(mixed, Mapping):
        predicate = _predicate(mixed, {"bits": bits, "group_size": group_size, "mode": mode})
    kw: dict[str, Any] = {"quantize": quantize, "dtype": dtype}
    if quantize:
        kw.update(q_bits=bits, q_group_size=group_size, q_mode=mode, quant_predicate=predicate)
    convert.convert(str(hf), str(out), **kw)
    return out


def mlx_logits(mlx_dir: Path, tokens: Sequence[int] | np.ndarray, *, float32: bool = False) -> np.ndarray:
    """MLX's logits [seq, vocab] (float32) for one sequence, a full prefill without a cache, as mlx_lm.load computes
    them. ``float32``: the same weights computed in float32, for bf16 / f16 checkpoints: each quantized module
    replaced by what ``mx.dequantize`` makes of it (mlx_lm's dequantize_model: affine values rounded to the scales'
    dtype), then every float tensor widened to float32 (exact).

    (MLX's quantized_matmul does not round that way when the activations are float32: it computes scale * q + bias
    in float32. On llama-bf16-q4-g32 the two differ by 7e-3 of max|logits|.)"""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import dequantize_model, load_model

    model, _ = load_model(Path(mlx_dir))
    if float32:
        model = dequantize_model(model)
        model.update(tree_map(lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a,
                              model.parameters()))
    logits = model(mx.array(np.asarray(tokens, dtype=np.int32))[None]).astype(mx.float32)
    return np.array(logits)[0]


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor dtypes, shapes, offsets and ``__metadata__``)."""
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(n))
    return header


TOL = 1e-4
W = 128  # the wider model (mlx_fixtures.save_hf): groups of 64 and 128 fit every matrix; the tiny one is 32 wide

# The case matrix of the MLX tests (tests/loaders/test_mlx_checkpoints.py through uaii-ir's reference evaluator,
# tests/runtime/test_mlx_checkpoint_run.py through the CPU backend).
# name -> save_mlx keywords; float32 models ("-w": the wider model). FAST (below) run in `make test`'s isolation
# venvs, the rest are `slow`.
F32: dict[str, dict[str, Any]] = {f"{arch}-q4-g32": dict(arch=arch, bits=4, group_size=32)
                                  for arch in ARCHS if arch != "qwen3moe"}
F32 |= {f"llama-q{b}-g{g}-w": dict(arch="llama", bits=b, group_size=g, hidden=W)
        for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)}  # llama-q4-g64-w: `mlx_lm.convert -q`'s defaults
F32 |= {
    "qwen2-q3-g32": dict(arch="qwen2", bits=3, group_size=32),  # tied: the quantized embedding is the lm_head too
    "mixtral-mxfp4": dict(arch="mixtral", mode="mxfp4"),  # switch_mlp banks, E8M0 scales
    "llama-mixed": dict(arch="llama", bits=4, group_size=32,  # overrides in config.json; lm_head named nowhere
                        mixed={"down_proj": {"bits": 8}, "v_proj": {"mode": "mxfp4"}, "lm_head": False}),
    # 32-wide inputs (q/k/v/o, gate/up) stay float, the 64-wide down_proj is quantized: float by shape, named nowhere
    "llama-q4-g64": dict(arch="llama", bits=4, group_size=64),
    "gemma3-q5-g64": dict(arch="gemma3", bits=5, group_size=64),
    # qwen3_moe's own predicate: the router at 8 bits in groups of 64 (an override without "mode": affine, also in
    # an mxfp4 file); o_proj's 32-wide input (4 heads x 8) stays float at group 64
    "qwen3moe-q4-g32-w": dict(arch="qwen3moe", bits=4, group_size=32, hidden=W),
    "qwen3moe-q4-g64-w": dict(arch="qwen3moe", hidden=W),
    "qwen3moe-mxfp4-w": dict(arch="qwen3moe", mode="mxfp4", hidden=W),
    "qwen3moe-nvfp4-w": dict(arch="qwen3moe", mode="nvfp4", hidden=W),
    "llama-mxfp8": dict(arch="llama", mode="mxfp8"),
    "llama-nvfp4": dict(arch="llama", mode="nvfp4"),
    "qwen2-nvfp4": dict(arch="qwen2", mode="nvfp4"),
    "phi3-mxfp4": dict(arch="phi3", mode="mxfp4"),  # fused qkv_proj / gate_up_proj
    "mixtral-nvfp4": dict(arch="mixtral", mode="nvfp4"),
    "qwen2moe-mxfp8": dict(arch="qwen2moe", mode="mxfp8"),  # shared expert and its gate
    "qwen2moe-q2-g32": dict(arch="qwen2moe", bits=2, group_size=32),
    "phi3-q6-g64-w": dict(arch="phi3", bits=6, group_size=64, hidden=W),
    "gpt2-q8-g128-w": dict(arch="gpt2", bits=8, group_size=128, hidden=W),  # Conv1D as [out, in], under model.
    # mlx-lm's recipes (--quant-predicate): v_proj / down_proj of the last layer and lm_head at the high bits
    **{f"llama-{r}-w": dict(arch="llama", group_size=64, hidden=W, mixed=r)
       for r in ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")},
    "qwen3moe-mixed_3_6-w": dict(arch="qwen3moe", group_size=64, hidden=W, mixed="mixed_3_6"),
    "mixtral-mixed": dict(arch="mixtral", bits=3, group_size=32,
                          mixed={"switch_mlp.down_proj": {"bits": 6}, "block_sparse_moe.gate": False,
                                 "embed_tokens": {"mode": "mxfp8", "bits": 8}}),
    "gemma3-mixed": dict(arch="gemma3", bits=4, group_size=32,
                         mixed={"o_proj": {"mode": "nvfp4", "group_size": 16}, "embed_tokens": False}),
    # no quantization: HF names and dtypes, but {"format": "mlx"} and (MoE) the experts stacked in switch_mlp banks
    "llama-float": dict(arch="llama", quantize=False),
    "mixtral-float": dict(arch="mixtral", quantize=False),
    "gpt2-float": dict(arch="gpt2", quantize=False),
}

# name -> (save_mlx keywords, bound against MLX): checkpoints MLX computes partly in bf16 / f16, held to 1e-4 only
# against the same weights computed by MLX in float32 (mlx_logits(float32=True)). MLX computes bf16 / f16 models in
# that dtype: on these fixtures max|MLX - MLX in float32| / max|.| is 5.3e-3 to 3.3e-2 in bf16 (an 8-bit mantissa,
# about 8 roundings deep; qwen3moe's router and gemma3's four norms per layer the most) and 2.8e-4 to 3.7e-3 in f16,
# against <= 6e-7 for float32 checkpoints (where float64 agrees with MLX to 4e-7). The bounds are about twice the
# worst. Two float32 checkpoints are here too: MLX dequantizes an mxfp4 / mxfp8 / nvfp4 embedding to bf16 (exact for
# those codes) and gemma3_text scales it by sqrt(hidden) rounded to bf16, GPT-2 adds the positions to it in place,
# both in bf16: 2.9e-3 and 7.2e-4 from float32 (the other architectures add it to float32 values first: 2e-7).
BF16, F16, FP_EMBED = 7e-2, 1e-2, 1e-2
HALF: dict[str, tuple[dict[str, Any], float]] = {
    "llama-bf16-q4-g32": (dict(arch="llama", bits=4, group_size=32, dtype="bfloat16"), BF16),
    "llama-f16-q4-g64-w": (dict(arch="llama", hidden=W, dtype="float16"), F16),
    "qwen2-bf16-mxfp4": (dict(arch="qwen2", mode="mxfp4", dtype="bfloat16"), BF16),
    "qwen3-f16-q8-g32": (dict(arch="qwen3", bits=8, group_size=32, dtype="float16"), F16),
    "gemma3-bf16-q4-g32": (dict(arch="gemma3", bits=4, group_size=32, dtype="bfloat16"), BF16),
    "phi3-f16-q6-g32": (dict(arch="phi3", bits=6, group_size=32, dtype="float16"), F16),
    "gpt2-bf16-q8-g32": (dict(arch="gpt2", bits=8, group_size=32, dtype="bfloat16"), BF16),
    "mixtral-f16-q4-g32": (dict(arch="mixtral", bits=4, group_size=32, dtype="float16"), F16),
    "qwen3moe-bf16-q4-g64-w": (dict(arch="qwen3moe", hidden=W, dtype="bfloat16"), BF16),
    "llama-bf16-float": (dict(arch="llama", quantize=False, dtype="bfloat16"), BF16),
    "qwen2-f16-float": (dict(arch="qwen2", quantize=False, dtype="float16"), F16),
    # (a bf16 / f16 MoE left in float cannot be a reference: MLX's CPU gather_mm computes float32 only)
    "gemma3-mxfp4": (dict(arch="gemma3", mode="mxfp4"), FP_EMBED),
    "gpt2-mxfp8": (dict(arch="gpt2", mode="mxfp8"), FP_EMBED),
}
CASES = {**F32, **{name: kw for name, (kw, _) in HALF.items()}}
FAST = {"llama-q4-g64-w", "qwen2-q3-g32", "mixtral-mxfp4", "llama-mixed", "llama-bf16-q4-g32"}


def params(cases: Mapping[str, Any]) -> list[Any]:
    """pytest parameters of ``cases``: FAST as they are, the rest marked ``slow``."""
    import pytest

    return [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in cases]


class Converted:
    """name of CASES -> its directory under ``root``, converted by save_mlx once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made: dict[str, Path] = {}

    def __call__(self, name: str) -> Path:
        if name not in self.made:
            kw = dict(CASES[name])
            self.made[name] = save_mlx(kw.pop("arch"), self.root / name, **kw)
        return self.made[name]


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want|: an error relative to the logits' scale."""
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max() / np.abs(want).max())
