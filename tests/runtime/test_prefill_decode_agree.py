"""The logits of a position do not depend on how the tokens before it were fed: one batched prefill, one token at a
time (decode), or a reused prefix plus a chunk of any size give the same numbers, in the default GEMM mode and in
the exact one (the Session option ``gemm``, the CLI's ``--gemm``).

Why: with the default int8-activation GEMM a last-bit difference between the batch and the decode kernels grows layer
by layer through the activation quantizers; it used to move SmolLM2's and Gemma-3's logits by up to 1.1 between the
two paths, so greedy text depended on whether a prompt prefix had been reused. The kernels now sum a row the same way
in both (tests/kernels/test_batch_matches_decode.py), so tiny models agree bit for bit and the real ones to the
0.05 the issue asks for (measured: exactly).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import loader_helpers as H
import numpy as np
import pytest

from uaii.ir.dtype import DType
from uaii.kernels import DEQUANT_TYPES
from uaii.kernels.testing import random_weight
from uaii.runtime import Session, SessionError
from uaii.runtime.cli.context import add_runtime_options, runtime_options

TYPES = sorted(DEQUANT_TYPES, key=lambda d: d.value)
VOCAB, LAYERS = 64, 3


def _tensor(dt: DType, n: int, k: int, seed: int) -> object:
    import gguf

    raw = random_weight(dt, n, k, seed)
    if dt is DType.F32:
        return raw.view(np.float32).reshape(n, k)
    if dt is DType.F16:
        return raw.view(np.float16).reshape(n, k)
    return raw.reshape(n, -1), gguf.GGMLQuantizationType[dt.value.upper()]


def tiny_llama(path: Path, dt: DType) -> Path:
    """A random llama whose matrices (embedding and output included) are all of type dt: rows of 5 and 11 blocks
    for the 32-value types (1-7 blocks past a group of 4 or 8), of 1 and 2 super-blocks for the K-quants."""
    d, ff = (256, 512) if dt.block_size == 256 else (160, 352)
    heads, kv_heads, hd = 4, 2, d // 4
    shapes = {"attn_q": (d, d), "attn_k": (kv_heads * hd, d), "attn_v": (kv_heads * hd, d), "attn_output": (d, d),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    tensors: dict[str, object] = {"token_embd.weight": _tensor(dt, VOCAB, d, 1),
                                  "output.weight": _tensor(dt, VOCAB, d, 2),
                                  "output_norm.weight": np.ones(d, np.float32)}
    for layer in range(LAYERS):
        tensors[f"blk.{layer}.attn_norm.weight"] = np.ones(d, np.float32)
        tensors[f"blk.{layer}.ffn_norm.weight"] = np.ones(d, np.float32)
        for i, (name, (n, k)) in enumerate(shapes.items()):
            tensors[f"blk.{layer}.{name}.weight"] = _tensor(dt, n, k, 10 * layer + i + 3)
    kv = {"llama.block_count": LAYERS, "llama.context_length": 256, "llama.embedding_length": d,
          "llama.feed_forward_length": ff, "llama.attention.head_count": heads,
          "llama.attention.head_count_kv": kv_heads, "llama.attention.key_length": hd,
          "llama.attention.value_length": hd, "llama.vocab_size": VOCAB, "llama.rope.dimension_count": hd,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 10000.0,
          "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
          "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(VOCAB)]}
    return H.write_gguf(path, "llama", kv, tensors)[0]


def prefill_logits(s: Session, ids: list[int]) -> np.ndarray:
    """Every position's logits from one batched pass (the functional graph, empty KV cache)."""
    graph = s.graph                                             # its inputs are the functional graph's
    feeds: dict[str, np.ndarray] = {"tokens": np.array(ids, np.int64), "positions": np.arange(len(ids))}
    for name in graph.inputs:
        if name.startswith("past_"):
            feeds[name] = np.zeros((0, *(int(v) for v in graph.tensor(name).shape[1:])), np.float32)
    return s.run(feeds)["logits"].reshape(len(ids), -1)


def decode_logits(s: Session, ids: list[int]) -> np.ndarray:
    s.reset()
    return np.stack([s.forward([t]) for t in ids])


def chunked_last(s: Session, ids: list[int], chunk: int) -> np.ndarray:
    """The last logits after feeding ``ids`` in chunks (a reused prefix, then the rest)."""
    s.reset()
    out = None
    for i in range(0, len(ids), chunk):
        out = s.forward(ids[i:i + chunk])
    assert out is not None
    return out


@pytest.mark.parametrize("dt", TYPES, ids=lambda d: d.value)
def test_tiny_model_prefill_equals_decode(dt: DType, tmp_path: Path) -> None:
    import gguf

    if dt.value.upper() not in gguf.GGMLQuantizationType.__members__:
        pytest.skip(f"the gguf package cannot write {dt.value} tensors (its kernels are covered by "
                    "tests/kernels/test_batch_matches_decode.py)")
    path = tiny_llama(tmp_path / f"{dt.value}.gguf", dt)
    ids = [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, 21)]
    for gemm in ("fast", "f32"):
        with Session(path, gemm=gemm) as s:
            pre, dec = prefill_logits(s, ids), decode_logits(s, ids)
            assert np.isfinite(pre).all()
            worst = float(np.abs(pre - dec).max())
            assert worst <= 0.05, f"{dt.value} {gemm}: max |prefill - decode| = {worst}"
            np.testing.assert_array_equal(pre, dec, err_msg=f"{dt.value} {gemm}")
            for chunk in (3, 4, 7):
                np.testing.assert_array_equal(chunked_last(s, ids, chunk), pre[-1], err_msg=f"chunks of {chunk}")


def test_gemm_option_selects_the_exact_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gemm="f32" is what $UAII_CPU_GEMM=f32 does, the option wins over the variable, and the fast mode differs."""
    path = tiny_llama(tmp_path / "q4_k.gguf", DType.Q4_K)
    ids = [5, 9, 17, 33, 2, 40]

    def last(**options: object) -> np.ndarray:
        with Session(path, **options) as s:
            return s.forward(ids)

    monkeypatch.setenv("UAII_CPU_GEMM", "f32")
    env_exact = last()
    monkeypatch.setenv("UAII_CPU_GEMM", "fast")
    env_fast = last()
    np.testing.assert_array_equal(last(gemm="f32"), env_exact)
    monkeypatch.delenv("UAII_CPU_GEMM")
    np.testing.assert_array_equal(last(), env_fast)
    np.testing.assert_array_equal(last(gemm="fast"), env_fast)
    assert np.abs(env_exact - env_fast).max() > 1e-4            # 8-bit activations: not the exact result
    with pytest.raises(SessionError, match="option gemm must be one of fast, f32"):
        Session(path, gemm="int4")


def test_gemm_flag_reaches_the_session_options() -> None:
    ap = argparse.ArgumentParser()
    add_runtime_options(ap)
    _, options = runtime_options(ap.parse_args(["--gemm", "f32"]))
    assert options["gemm"] == "f32"
    _, options = runtime_options(ap.parse_args([]))
    assert "gemm" not in options                                # the default: $UAII_CPU_GEMM, else fast
    with pytest.raises(SystemExit):
        ap.parse_args(["--gemm", "f16"])


TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
        "metal type, oil-based ink and a wooden press adapted from those used to make wine. Within a few decades "
        "presses spread across Europe, books became cheaper, and ideas travelled faster than ever before.")


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_real_model_prefill_equals_decode(model: str, request: pytest.FixtureRequest) -> None:
    """SmolLM2 (Q4_1, Q8_0) and Gemma-3 (Q5_0, Q4_K, Q6_K, Q8_0): ~60 positions, default GEMM. Before the fix the
    two paths differed by up to 1.14 (SmolLM2) and 0.92 (Gemma-3) logits."""
    path = request.getfixturevalue(model)
    with Session(path) as s:
        ids = s.tokenize(TEXT)[:64]
        pre, dec = prefill_logits(s, ids), decode_logits(s, ids)
        worst = np.abs(pre - dec).max(axis=1)
        print(f"\n{path.name}: {len(ids)} positions, max |prefill - decode| {worst.max():.3g}")
        assert worst.max() <= 0.05, f"position {int(worst.argmax())}: {worst.max()}"
        np.testing.assert_array_equal(chunked_last(s, ids, 5), pre[-1])
