"""Synthetic llama- and MoE-shaped GGUF models with random block-quantized weights, for the streaming benchmarks.

Throughput under a memory budget does not need meaningful weights, only real shapes and real bytes. These models
have Llama-3-8B layer shapes (llama: d=4096, 32 query heads, 8 KV heads, d_ff=14336) or OLMoE-like MoE layers
(d=2048, 64 experts of d_ff=1024, top-4), a 32000-token vocabulary (a small embedding) and as many layers as a
requested size needs. Quantized weights are random bytes with one finite f16 scale per tensor, chosen so that a
matmul's output has about half the RMS of its input (no overflow over any depth), its sign random per block:
random Q4_0 nibbles decode to -8..7, mean -0.5, and with one sign every product would add a common component to
every token's hidden state, so that a MoE router picked the same experts for every token (99 % expert-cache hits
without any locality); norms are F32 ones, MoE routers
F32 normals. The tokenizer is a working gpt2 byte-level BPE (the 700-token vocabulary of the tokenizer golden
tests) padded with filler tokens up to the vocabulary size.

The writer streams: GGUFWriter writes the header, metadata and tensor table; the tensor data follows in chunks of
a few MiB at the aligned offsets that table promises, so the generator's memory stays small (< 300 MiB, reported)
whatever the file size. Content is a pure function of the parameters and the seed.

    python bench/synth_gguf.py llama --size-gb 4            # $UAII_CACHE_DIR/models/synth-llama-q4_0-4g.gguf
    python bench/synth_gguf.py moe --size-gb 4 --json       # synth-moe-q4_0-4g.gguf, one JSON line
    python bench/synth_gguf.py llama --out /tmp/x.gguf --layers 2 --d-model 256 --d-ff 512 --vocab 1024

Files made by the CLI (or :func:`ensure_synth`) get a sidecar ``<file>.json`` with the parameters, the size, the
full sha256 and a probe sha256 (64 stripes of 1 MiB). A later call reuses the file when the parameters, size and
probe hash match (``--verify``: the full hash too) and otherwise regenerates it atomically (temp file + rename).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[1]
GOLDEN_TOKENIZER = REPO / "tests" / "golden" / "tokenizers" / "tiny.json"
GENERATOR_VERSION = 2  # 2: block scales of random sign (the hidden states differ from token to token)
GB = 1e9  # sizes are decimal gigabytes, as in the GB/s figures
MiB = 1 << 20
CHUNK_BYTES = 16 * MiB
PROBE_STRIPES, PROBE_BYTES = 64, MiB


@dataclass(frozen=True)
class QType:
    ggml: gguf.GGMLQuantizationType
    block: int  # weights per block
    block_bytes: int  # f16 scale + payload
    var: float  # variance of the integer value a random payload decodes to (scale 1)


QTYPES = {
    # Q4_0: d * (q - 8), q uniform in 0..15  -> E[(q-8)^2] = 21.5
    "q4_0": QType(gguf.GGMLQuantizationType.Q4_0, 32, 18, 21.5),
    # Q8_0: d * q, q uniform int8            -> E[q^2] = 5461.5
    "q8_0": QType(gguf.GGMLQuantizationType.Q8_0, 32, 34, 5461.5),
}

# Shapes of the CLI's --size-gb models.
LLAMA_SHAPE = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "d_ff": 14336, "vocab": 32000}
MOE_SHAPE = {"d_model": 2048, "d_ff_expert": 1024, "n_experts": 64, "top_k": 4, "vocab": 32000}
MOE_OPTIONAL = ("head_dim", "router_zipf")


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: numpy-order shape; ``kind`` quant | norm | router; ``gain`` the output/input RMS of a
    quantized matmul (0: per-element std 1, for the embedding)."""

    name: str
    shape: tuple[int, ...]
    kind: str = "quant"
    gain: float = 0.5
    zipf: float = 0.0  # routers: the exponent of their experts' popularity (0: every expert alike)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# --- tensor tables ------------------------------------------------------------------------------------------------
def _attention(i: int, d: int, n_heads: int, n_kv: int, head_dim: int | None = None) -> list[Tensor]:
    hd = head_dim or d // n_heads
    p = f"blk.{i}"
    return [Tensor(f"{p}.attn_norm.weight", (d,), "norm"),
            Tensor(f"{p}.attn_q.weight", (n_heads * hd, d)),
            Tensor(f"{p}.attn_k.weight", (n_kv * hd, d)),
            Tensor(f"{p}.attn_v.weight", (n_kv * hd, d)),
            Tensor(f"{p}.attn_output.weight", (d, n_heads * hd)),
            Tensor(f"{p}.ffn_norm.weight", (d,), "norm")]


def llama_tensors(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
                  vocab: int) -> list[Tensor]:
    """llama.cpp's tensors of a llama model, in file (= execution) order."""
    out = [Tensor("token_embd.weight", (vocab, d_model), gain=0.0)]
    for i in range(n_layers):
        out += _attention(i, d_model, n_heads, n_kv_heads)
        out += [Tensor(f"blk.{i}.ffn_gate.weight", (d_ff, d_model)), Tensor(f"blk.{i}.ffn_up.weight", (d_ff, d_model)),
                Tensor(f"blk.{i}.ffn_down.weight", (d_model, d_ff))]
    return [*out, Tensor("output_norm.weight", (d_model,), "norm"), Tensor("output.weight", (vocab, d_model), gain=1.0)]


def moe_tensors(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff_expert: int, n_experts: int,
                vocab: int, head_dim: int | None = None, router_zipf: float = 0.0) -> list[Tensor]:
    """A mixtral-style GGUF (llama arch + experts): packed banks ``ffn_{gate,up,down}_exps`` and an F32 router."""
    out = [Tensor("token_embd.weight", (vocab, d_model), gain=0.0)]
    for i in range(n_layers):
        out += _attention(i, d_model, n_heads, n_kv_heads, head_dim)
        out += [Tensor(f"blk.{i}.ffn_gate_inp.weight", (n_experts, d_model), "router", zipf=router_zipf),
                Tensor(f"blk.{i}.ffn_gate_exps.weight", (n_experts, d_ff_expert, d_model)),
                Tensor(f"blk.{i}.ffn_up_exps.weight", (n_experts, d_ff_expert, d_model)),
                Tensor(f"blk.{i}.ffn_down_exps.weight", (n_experts, d_model, d_ff_expert))]
    return [*out, Tensor("output_norm.weight", (d_model,), "norm"), Tensor("output.weight", (vocab, d_model), gain=1.0)]


def tensor_bytes(t: Tensor, q: QType) -> int:
    if t.kind != "quant":
        return 4 * t.numel
    if t.shape[-1] % q.block:
        raise ValueError(f"[synth] {t.name}: rows of {t.shape[-1]} weights are not a multiple of the "
                         f"{q.block}-weight blocks")
    return t.numel // q.block * q.block_bytes


# --- tokenizer ------------------------------------------------------------------------------------------------------
def tokenizer_spec(vocab: int) -> dict[str, Any]:
    """The tiny golden gpt2-BPE vocabulary (smollm pre-tokenizer), padded with filler tokens to ``vocab``."""
    base = json.loads(GOLDEN_TOKENIZER.read_text(encoding="utf-8"))["configs"]["bpe-smollm"]["spec"]
    tokens, types = list(base["tokens"]), list(base["token_type"])
    if vocab < len(tokens):
        raise ValueError(f"[synth] vocab {vocab} is smaller than the {len(tokens)}-token base tokenizer")
    # 'Ġ' is the byte-level space: fillers decode as " w123"; no merge ever produces them.
    tokens += [f"Ġw{i}" for i in range(vocab - len(tokens))]
    types += [1] * (vocab - len(types))
    return {**base, "tokens": tokens, "token_type": types}


def _add_tokenizer(w: gguf.GGUFWriter, vocab: int) -> None:
    spec = tokenizer_spec(vocab)
    w.add_tokenizer_model(spec["model"])
    w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(spec["tokens"])
    w.add_token_types(spec["token_type"])
    w.add_token_merges(spec["merges"])
    w.add_bos_token_id(spec["bos_id"])
    w.add_eos_token_id(spec["eos_id"])
    w.add_add_bos_token(False)


# --- data -----------------------------------------------------------------------------------------------------------
def _scale(t: Tensor, q: QType) -> float:
    """Per-block f16 scale: output RMS = gain x input RMS for a matmul over K = shape[-1] (std 1 for gain 0)."""
    if t.gain == 0.0:
        return 1.0 / math.sqrt(q.var)
    return t.gain / math.sqrt(q.var * t.shape[-1])


def _chunks(t: Tensor, q: QType, rng: np.random.Generator) -> Iterator[memoryview]:
    """The tensor's bytes, CHUNK_BYTES at a time."""
    if t.kind == "norm":
        yield memoryview(np.ones(t.numel, np.float32)).cast("B")
        return
    if t.kind == "router":
        gains = router_gains(t.shape[0], t.zipf, rng)
        rows = max(1, CHUNK_BYTES // (4 * t.shape[-1]))
        for r in range(0, t.shape[0], rows):
            m = min(rows, t.shape[0] - r)
            w = rng.standard_normal((m, t.shape[-1]), np.float32) / np.float32(math.sqrt(t.shape[-1]))
            yield memoryview(np.ascontiguousarray(w * gains[r:r + m, None])).cast("B")
        return
    scale = np.frombuffer(np.float16(_scale(t, q)).tobytes(), np.uint8)
    assert np.isfinite(np.frombuffer(scale.tobytes(), np.float16)).all()
    n_blocks = t.numel // q.block
    per = max(1, CHUNK_BYTES // q.block_bytes)
    for b in range(0, n_blocks, per):
        nb = min(per, n_blocks - b)
        nbytes = nb * q.block_bytes
        raw = rng.integers(0, np.iinfo(np.uint64).max, -(-nbytes // 8), dtype=np.uint64, endpoint=True)
        blocks = raw.view(np.uint8)[:nbytes].reshape(nb, q.block_bytes)
        blocks[:, :2] = scale
        blocks[:, 1] |= rng.integers(0, 2, nb, dtype=np.uint8) << 7  # the f16 sign bit (byte 1, bit 7)
        yield memoryview(blocks).cast("B")


def router_gains(n_experts: int, zipf: float, rng: np.random.Generator) -> np.ndarray:
    """Per-expert scales of a router's rows: the expert of popularity rank r (a random order per layer) gets
    (r + 1) ** -zipf, normalized to a mean square of 1. A router logit is a row's dot with the hidden state, so a
    larger row spreads its logits wider and wins the top-k more often: zipf 0 routes uniformly (no locality: what
    an expert cache can hope for at random), larger exponents concentrate the traffic on a few experts per layer,
    as traces of real MoE models do. Drawn first from the tensor's generator: zipf 0 leaves every other byte of the
    file as it was."""
    if zipf == 0.0:
        return np.ones(n_experts, np.float32)
    g = (np.arange(n_experts, dtype=np.float64) + 1.0) ** -zipf
    g = g[rng.permutation(n_experts)]
    return (g / math.sqrt(float(np.mean(g * g)))).astype(np.float32)


def _write(path: Path, arch_kv: dict[str, Any], tensors: list[Tensor], vocab: int, qtype: str, seed: int,
           name: str) -> Path:
    """Stream a GGUF: header + metadata + tensor table through GGUFWriter, then the data chunk by chunk."""
    q = QTYPES[qtype]
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name(name)
    w.add_file_type({"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, (value, vtype) in arch_kv.items():
        w.add_key_value(key, value, vtype)
    _add_tokenizer(w, vocab)
    for t in tensors:
        raw = None if t.kind != "quant" else q.ggml
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), tensor_bytes(t, q), raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None and len(w.fout) == 1
    fout = w.fout[0]
    align = w.data_alignment
    fout.write(bytes(-fout.tell() % align))
    for i, t in enumerate(tensors):
        rng = np.random.default_rng([seed, i])
        written = 0
        for chunk in _chunks(t, q, rng):
            fout.write(chunk)
            written += chunk.nbytes
        assert written == tensor_bytes(t, q), t.name
        fout.write(bytes(-written % align))
    fout.flush()
    os.fsync(fout.fileno())
    with contextlib.suppress(AttributeError, OSError):  # not ours to keep cached: benchmarks read with O_DIRECT
        os.posix_fadvise(fout.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    w.close()
    return path


def _kv(n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, vocab: int,
        context: int) -> dict[str, Any]:
    U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32
    return {"llama.context_length": (context, U32), "llama.embedding_length": (d_model, U32),
            "llama.block_count": (n_layers, U32), "llama.feed_forward_length": (d_ff, U32),
            "llama.attention.head_count": (n_heads, U32), "llama.attention.head_count_kv": (n_kv_heads, U32),
            "llama.rope.freq_base": (500000.0, F32), "llama.rope.dimension_count": (d_model // n_heads, U32),
            "llama.attention.layer_norm_rms_epsilon": (1e-5, F32), "llama.vocab_size": (vocab, U32)}


def write_llama_gguf(path: str | os.PathLike[str], n_layers: int, d_model: int, n_heads: int, n_kv_heads: int,
                     d_ff: int, vocab: int, qtype: str = "q4_0", seed: int = 0, *, context: int = 8192) -> Path:
    """A llama GGUF of random ``qtype`` weights (see the module doc). Returns ``path``."""
    _check_heads(d_model, n_heads, n_kv_heads)
    tensors = llama_tensors(n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab)
    kv = _kv(n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab, context)
    return _write(Path(path), kv, tensors, vocab, qtype, seed, f"synth-llama-{n_layers}L-{d_model}d")


def write_moe_gguf(path: str | os.PathLike[str], n_layers: int, d_model: int, d_ff_expert: int, n_experts: int = 64,
                   top_k: int = 4, vocab: int = 32000, qtype: str = "q4_0", seed: int = 0, *,
                   n_heads: int | None = None, n_kv_heads: int | None = None, head_dim: int | None = None,
                   router_zipf: float = 0.0, context: int = 8192) -> Path:
    """A mixtral-style MoE GGUF (llama arch, ``expert_count`` experts, ``top_k`` used). Heads default to a head
    dimension of 128 (at most d_model / 16) and 4 query heads per KV head; ``head_dim`` sets it apart from d_model
    (Qwen3-MoE: 96 heads of 128 on d_model 6144, written as ``attention.key_length``/``value_length``).
    ``router_zipf``: the routers' locality (:func:`router_gains`)."""
    n_heads = n_heads or max(1, d_model // max(128, d_model // 16))
    n_kv_heads = n_kv_heads or max(1, n_heads // 4)
    _check_heads(d_model, n_heads, n_kv_heads, head_dim)
    if not 0 < top_k <= n_experts:
        raise ValueError(f"[synth] top_k {top_k} must be in 1..{n_experts}")
    if router_zipf < 0:
        raise ValueError(f"[synth] router_zipf {router_zipf} must be >= 0")
    U32 = gguf.GGUFValueType.UINT32
    tensors = moe_tensors(n_layers, d_model, n_heads, n_kv_heads, d_ff_expert, n_experts, vocab, head_dim,
                          router_zipf)
    kv = {**_kv(n_layers, d_model, n_heads, n_kv_heads, d_ff_expert, vocab, context),
          "llama.expert_count": (n_experts, U32), "llama.expert_used_count": (top_k, U32),
          "llama.expert_feed_forward_length": (d_ff_expert, U32)}
    if head_dim:
        kv.update({"llama.attention.key_length": (head_dim, U32), "llama.attention.value_length": (head_dim, U32),
                   "llama.rope.dimension_count": (head_dim, U32)})
    return _write(Path(path), kv, tensors, vocab, qtype, seed,
                  f"synth-moe-{n_layers}L-{d_model}d-{n_experts}x{top_k}")


def _check_heads(d_model: int, n_heads: int, n_kv_heads: int, head_dim: int | None = None) -> None:
    if head_dim is not None:
        if head_dim <= 0 or head_dim % 2 or n_heads % n_kv_heads:
            raise ValueError(f"[synth] head_dim {head_dim}, {n_heads} heads, {n_kv_heads} KV heads: the head "
                             "dimension must be even and KV heads must divide heads")
        return
    if d_model % n_heads or n_heads % n_kv_heads or (d_model // n_heads) % 2:
        raise ValueError(f"[synth] d_model {d_model}, {n_heads} heads, {n_kv_heads} KV heads: heads must divide "
                         "d_model into an even head dimension and KV heads must divide heads")


# --- sizing, cache, sidecar ---------------------------------------------------------------------------------------
def model_params(kind: str, n_layers: int, qtype: str = "q4_0", seed: int = 0, **shape: int | None) -> dict[str, Any]:
    """Everything that decides a CLI model's bytes (the sidecar compares it): the default shape of ``kind`` with
    ``shape`` overrides (None: keep the default)."""
    base: dict[str, Any] = dict(LLAMA_SHAPE) if kind == "llama" else {**MOE_SHAPE, "n_heads": 16, "n_kv_heads": 4}
    optional = () if kind == "llama" else MOE_OPTIONAL  # in the parameters only when set: older files stay valid
    unknown = sorted(k for k, v in shape.items() if v is not None and k not in base and k not in optional)
    if unknown:
        raise ValueError(f"[synth] {kind} models have no setting {', '.join(unknown)}")
    base.update({k: v for k, v in shape.items() if v is not None})
    return {"kind": kind, "n_layers": n_layers, **base, "qtype": qtype, "seed": seed,
            "generator_version": GENERATOR_VERSION}


def model_bytes(params: dict[str, Any]) -> int:
    """Tensor bytes of the model ``params`` describe (the file adds metadata and alignment)."""
    return sum(tensor_bytes(t, QTYPES[params["qtype"]]) for t in _tensors(params["kind"], params))


def layers_for(kind: str, size_gb: float, qtype: str = "q4_0", **shape: int | None) -> int:
    """The fewest layers that make the model at least ``size_gb`` GB."""
    n = 1
    while model_bytes(model_params(kind, n, qtype, **shape)) < size_gb * GB:
        n += 1
    return n


def _tensors(kind: str, p: dict[str, Any]) -> list[Tensor]:
    if kind == "llama":
        return llama_tensors(p["n_layers"], p["d_model"], p["n_heads"], p["n_kv_heads"], p["d_ff"], p["vocab"])
    return moe_tensors(p["n_layers"], p["d_model"], p["n_heads"], p["n_kv_heads"], p["d_ff_expert"],
                       p["n_experts"], p["vocab"], p.get("head_dim"), p.get("router_zipf", 0.0))


def write_from_params(path: Path, p: dict[str, Any]) -> Path:
    if p["kind"] == "llama":
        return write_llama_gguf(path, p["n_layers"], p["d_model"], p["n_heads"], p["n_kv_heads"], p["d_ff"],
                                p["vocab"], p["qtype"], p["seed"])
    return write_moe_gguf(path, p["n_layers"], p["d_model"], p["d_ff_expert"], p["n_experts"], p["top_k"],
                          p["vocab"], p["qtype"], p["seed"], n_heads=p["n_heads"], n_kv_heads=p["n_kv_heads"],
                          head_dim=p.get("head_dim"), router_zipf=p.get("router_zipf", 0.0))


def cache_dir() -> Path:
    base = os.environ.get("UAII_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "uaii")
    return Path(base) / "models"


def default_path(kind: str, size_gb: float, qtype: str = "q4_0", params: dict[str, Any] | None = None) -> Path:
    """``synth-llama-q4_0-4g.gguf``; a model of non-default shape, layer count or seed gets a hash of its
    parameters in the name, so it never replaces the default one."""
    name = f"synth-{kind}-{qtype}-{size_gb:g}g"
    if params is not None and params != model_params(kind, layers_for(kind, size_gb, qtype), qtype):
        name += "-" + hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:8]
    return cache_dir() / f"{name}.gguf"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def probe_sha256(path: Path) -> str:
    """sha256 of PROBE_STRIPES stripes of PROBE_BYTES spread over the file (cheap; catches truncation and
    overwritten regions that the size check misses)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for k in range(PROBE_STRIPES):
            f.seek(size * k // PROBE_STRIPES)
            h.update(f.read(PROBE_BYTES))
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def cached_ok(path: Path, params: dict[str, Any], verify: bool = False) -> tuple[bool, str]:
    """Whether ``path`` is the file ``params`` describe, by its sidecar; the reason when it is not."""
    side = _sidecar(path)
    if not path.is_file() or not side.is_file():
        return False, "missing"
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, "unreadable sidecar"
    if meta.get("params") != params:
        return False, "different parameters"
    if path.stat().st_size != meta.get("size"):
        return False, f"size {path.stat().st_size}, expected {meta.get('size')}"
    if probe_sha256(path) != meta.get("probe_sha256"):
        return False, "probe sha256 mismatch"
    if verify and sha256_of(path) != meta.get("sha256"):
        return False, "sha256 mismatch"
    return True, "ok"


def ensure_synth(path: Path, params: dict[str, Any], verify: bool = False, quiet: bool = True) -> dict[str, Any]:
    """Reuse ``path`` when its sidecar matches ``params``, else write it (temp file + atomic rename). Returns
    path, size, sha256, whether it was reused, and seconds spent writing."""
    ok, why = cached_ok(path, params, verify)
    if ok:
        meta = json.loads(_sidecar(path).read_text(encoding="utf-8"))
        return {"path": str(path), "size": meta["size"], "sha256": meta["sha256"], "reused": True, "write_s": 0.0,
                "params": params}
    path.parent.mkdir(parents=True, exist_ok=True)
    total = model_bytes(params)
    if not quiet:
        print(f"[synth] writing {path} ({total / GB:.2f} GB of tensors, {why})", file=sys.stderr)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _sidecar(path).unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        write_from_params(tmp, params)
        write_s = time.perf_counter() - t0
        digest = sha256_of(tmp)
        os.replace(tmp, path)  # atomic: a half-written file never carries the final name
    finally:
        tmp.unlink(missing_ok=True)
    meta = {"params": params, "size": path.stat().st_size, "sha256": digest, "probe_sha256": probe_sha256(path),
            "write_s": round(write_s, 2)}
    side_tmp = _sidecar(path).with_suffix(".tmp")
    side_tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    os.replace(side_tmp, _sidecar(path))
    return {"path": str(path), "size": meta["size"], "sha256": digest, "reused": False, "write_s": write_s,
            "params": params}


def peak_rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["llama", "moe"])
    ap.add_argument("--out", type=Path, help="output file (default: the model cache, named by kind/qtype/size)")
    ap.add_argument("--size-gb", type=float, default=4.0, help="at least this many GB (1e9 bytes); sets --layers")
    ap.add_argument("--layers", type=int, help="layer count (overrides --size-gb)")
    ap.add_argument("--qtype", choices=sorted(QTYPES), default="q4_0")
    ap.add_argument("--seed", type=int, default=0)
    for flag in ("d-model", "d-ff", "d-ff-expert", "n-heads", "n-kv-heads", "n-experts", "top-k", "vocab"):
        ap.add_argument(f"--{flag}", type=int, help="override the default shape")
    ap.add_argument("--verify", action="store_true", help="check the full sha256 of a cached file")
    ap.add_argument("--json", action="store_true", help="print one JSON line (path, size, times, peak RSS)")
    args = ap.parse_args(argv)
    names = ("d_model", "d_ff", "d_ff_expert", "n_heads", "n_kv_heads", "n_experts", "top_k", "vocab")
    shape = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    n_layers = args.layers or layers_for(args.kind, args.size_gb, args.qtype, **shape)
    params = model_params(args.kind, n_layers, args.qtype, args.seed, **shape)
    path = args.out or default_path(args.kind, args.size_gb, args.qtype, params)
    t0 = time.perf_counter()
    res = ensure_synth(path, params, verify=args.verify, quiet=args.json)
    res.update(wall_s=time.perf_counter() - t0, peak_rss_bytes=peak_rss_bytes())
    if args.json:
        print(json.dumps(res))
    else:
        state = "reused" if res["reused"] else f"written in {res['write_s']:.1f} s"
        print(f"{res['path']}: {res['size'] / GB:.2f} GB, {n_layers} layers, {state}; "
              f"generator peak RSS {res['peak_rss_bytes'] / MiB:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
