"""Shared by the ONNX contrib/generation tests (tests/loaders) and the decode test of the runtime (tests/runtime):
onnxruntime runs, weight reads for uaii.ir's reference, rotary caches as exporters write them, and two hand-built
causal LMs with KV I/O — an onnxruntime-genai-style one (GroupQueryAttention) and an exporter-style one (MatMul /
Softmax attention with a causal mask built from positions) — with onnxruntime's greedy loop over them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from uaii.ir import Graph, Tensor, check
from uaii.ir.kvcache import kv_layers
from uaii.ir.reference import evaluate
from uaii.loaders import LoadedModel
from uaii.loaders.onnx.importer import ImportedGraph, import_graph
from uaii.loaders.onnx.kv import KVPlan, prepare_kv
from uaii.loaders.onnx.reader import open_onnx


def weights_of(imported: ImportedGraph | LoadedModel) -> Any:
    """A reader of the weights an import references (its ``weights``: file, offset, dtype, shape) for uaii.ir's
    reference evaluator."""
    def read(t: Tensor) -> np.ndarray:
        info = imported.weights[str(t.weight)]
        count = int(np.prod(info.shape)) if info.shape else 1
        return np.fromfile(info.file, dtype=info.dtype.numpy, count=count, offset=info.offset).reshape(info.shape)
    return read


def ort_run(path: Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, dict(feeds)), strict=True))


def rope_caches(rows: int, rot: int, theta: float = 10000.0, factors: np.ndarray | None = None,
                magnitude: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches as exporters write them: angles in float32."""
    inv = (1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float32) / rot)).astype(np.float32)
    if factors is not None:
        inv = (inv / factors).astype(np.float32)
    ang = np.outer(np.arange(rows, dtype=np.float32), inv)
    return (np.cos(ang) * magnitude).astype(np.float32), (np.sin(ang) * magnitude).astype(np.float32)


def quantize(w: np.ndarray, bits: int, block: int, zero_points: bool) -> tuple[np.ndarray, ...]:
    """com.microsoft MatMulNBits layout of w [N, K]: B [N, blocks, block*bits/8], scales [N*blocks], packed zp."""
    n, k = w.shape
    blocks = -(-k // block)
    padded = np.zeros((n, blocks * block), np.float32)
    padded[:, :k] = w
    wb = padded.reshape(n, blocks, block)
    top = (1 << bits) - 1
    if zero_points:
        lo, hi = wb.min(-1), wb.max(-1)
        scale = np.maximum(hi - lo, 1e-6) / top
        zp = np.clip(np.round(-lo / scale), 0, top).astype(np.uint8)
    else:
        scale = np.maximum(np.abs(wb).max(-1), 1e-6) / (1 << (bits - 1))
        zp = np.full((n, blocks), 1 << (bits - 1), np.uint8)
    q = np.clip(np.round(wb / scale[..., None]) + zp[..., None], 0, top).astype(np.uint8)
    if bits == 4:
        q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
        zpp = np.zeros((n, -(-blocks // 2)), np.uint8)
        for j in range(blocks):
            zpp[:, j // 2] |= (zp[:, j] << (4 * (j % 2))).astype(np.uint8)
    else:
        zpp = zp
    return q, scale.astype(np.float32).reshape(-1), zpp.reshape(-1)


MS = "com.microsoft"
VOCAB, D, HEADS, KV, FF = 64, 64, 4, 2, 96
HEAD = D // HEADS
PROMPT = [5, 17, 3, 42, 8]
NEW = 8


class Builder:
    """Nodes and initializers of a hand-built model, with generated value names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: dict[str, np.ndarray] = {}
        self.n = 0

    def w(self, *shape: int, scale: float = 0.3) -> str:
        self.n += 1
        name = f"w{self.n}"
        self.inits[name] = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        return name

    def c(self, value: Any, dtype: Any = np.int64) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits[name] = np.asarray(value, dtype)
        return name

    def op(self, op: str, ins: list[str], n_out: int = 1, domain: str = "", **attrs: Any) -> Any:
        outs = []
        for _ in range(n_out):
            self.n += 1
            outs.append(f"v{self.n}")
        self.nodes.append(helper.make_node(op, ins, outs, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, inputs: list[Any], outputs: list[str], opset: int = 17) -> Any:
        graph = helper.make_graph(self.nodes, "lm", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                                  initializer=[numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                                 ir_version=9)

    def rename(self, old: str, new: str) -> None:
        for n in self.nodes:
            n.output[:] = [new if o == old else o for o in n.output]
            n.input[:] = [new if i == old else i for i in n.input]


def cache_io(layers: int, head: int | str = HEAD) -> tuple[list[Any], list[str]]:
    """Cache I/O names and past declarations (``head`` symbolic as the genai builder writes it: kv_cache_dim)."""
    past = [helper.make_tensor_value_info(f"past_key_values.{i}.{t}", TensorProto.FLOAT,
                                          ["batch_size", KV, "past_sequence_length", head])
            for i in range(layers) for t in ("key", "value")]
    return past, [f"present.{i}.{t}" for i in range(layers) for t in ("key", "value")]


def ids_input(name: str, dim: str) -> Any:
    return helper.make_tensor_value_info(name, TensorProto.INT64, ["batch_size", dim])


# --- an onnxruntime-genai-style model (GroupQueryAttention, packed QKV, rotary in the op) -------------------------
def genai_like(layers: int = 2, window: int = -1, seed: int = 1, quantized: bool = False,
               seqlens_offset: int = 1) -> Any:
    """With ``quantized`` every projection is a 4-bit MatMulNBits (block 32, zero points), as the builder's int4.
    ``seqlens_offset``: seqlens_k = sum(attention_mask) - offset (1 as onnxruntime-genai writes it)."""
    b = Builder(seed)

    def proj(x: str, k: int, n: int) -> str:
        if not quantized:
            return b.op("MatMul", [x, b.w(k, n)])
        q, scales, zp = quantize((b.rng.standard_normal((n, k)) * 0.3).astype(np.float32), 4, 32, True)
        names = [b.c(q, np.uint8), b.c(scales, np.float32), b.c(zp, np.uint8)]
        return b.op("MatMulNBits", [x, *names], domain=MS, K=k, N=n, bits=4, block_size=32)

    one = b.c([1])
    seqlens = b.op("Cast", [b.op("Sub", [b.op("ReduceSum", ["attention_mask", one], keepdims=0),
                                         b.c([seqlens_offset])])], to=TensorProto.INT32)
    total = b.op("Cast", [b.op("Gather", [b.op("Shape", ["attention_mask"]), b.c(1)], axis=0)],
                 to=TensorProto.INT32)
    cos, sin = rope_caches(256, HEAD)
    b.inits["cos_cache"], b.inits["sin_cache"] = cos, sin
    resid = b.op("Gather", [b.w(VOCAB, D, scale=1.0), "input_ids"])
    normed = b.op("SimplifiedLayerNormalization", [resid, b.w(D)], epsilon=1e-5)
    for i in range(layers):
        qkv = proj(normed, D, (HEADS + 2 * KV) * HEAD)
        b.nodes.append(helper.make_node(
            "GroupQueryAttention", [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", seqlens,
                                    total, "cos_cache", "sin_cache"],
            [f"attn{i}", f"present.{i}.key", f"present.{i}.value"], domain=MS, num_heads=HEADS, kv_num_heads=KV,
            do_rotary=1, local_window_size=window, scale=float(HEAD ** -0.5)))
        o = proj(f"attn{i}", D, D)
        normed2, _, _, resid = b.op("SkipSimplifiedLayerNormalization", [resid, o, b.w(D)], 4, MS, epsilon=1e-5)
        gate, up = proj(normed2, D, FF), proj(normed2, D, FF)
        act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
        down = proj(act, FF, D)
        outs = b.op("SkipSimplifiedLayerNormalization", [resid, down, b.w(D)], 4 if i < layers - 1 else 1, MS,
                    epsilon=1e-5)
        normed, resid = (outs[0], outs[3]) if i < layers - 1 else (outs, resid)
    logits = proj(normed, D, VOCAB)
    b.rename(logits, "logits")
    past, presents = cache_io(layers, "kv_cache_dim")
    inputs = [ids_input("input_ids", "sequence_length"), ids_input("attention_mask", "total_sequence_length"), *past]
    return b.model(inputs, ["logits", *presents], opset=21)


# --- an exporter-style model (MatMul/Softmax attention, mask from positions) -------------------------------------
F32_MIN = float(np.finfo(np.float32).min)


def exported_like(layers: int = 2, window: int = 0, alibi: bool = False, softcap: float = 0.0, masked: bool = True,
                  seed: int = 2, *, scale: float = HEAD ** -0.5, scale_split: bool = False, post_scale: float = 1.0,
                  mask_value: float = F32_MIN, square_mask: bool = False, softcap_inner: float = 0.0,
                  softmax_axis: int = -1, v_scale: float = 1.0, repeat: str = "in-place", q_bias: bool = False,
                  k_bias: bool = False, v_bias: bool = False, head_scales: bool = False,
                  key_transposes: bool = False) -> Any:
    """``softcap``: gemma's cap * tanh(scores / cap) before the mask; ``masked=False``: no mask at all (every query
    sees every key, the future of a prompt included). The rest vary one thing the KV mapping must carry exactly or
    refuse: ``scale`` of the scores (``scale_split``: half of it, as sqrt, on q and on the keys); ``post_scale``
    multiplies the masked scores; ``mask_value`` fills hidden keys; ``square_mask`` builds the mask for every
    position (a [total, total] computation) and slices the new rows; ``softcap_inner``: the divisor inside tanh
    when it is not the cap; ``softmax_axis``; ``v_scale`` multiplies the repeated values; ``repeat`` ``tiled``
    repeats the kv heads as a whole (query head h reads kv head h % kv) instead of each in place; ``q_bias`` /
    ``k_bias`` / ``v_bias`` add a constant to q / the repeated keys / the repeated values; ``head_scales``
    multiplies the scores by a per-head constant; ``key_transposes`` routes the keys through two more Transposes
    that cancel."""
    b = Builder(seed)
    s = b.op("Gather", [b.op("Shape", ["input_ids"]), b.c(1)], axis=0)
    t = b.op("Gather", [b.op("Shape", ["attention_mask"]), b.c(1)], axis=0)
    q_pos = b.op("Range", [b.c(0) if square_mask else b.op("Sub", [t, s]), t, b.c(1)])
    k_pos = b.op("Range", [b.c(0), t, b.c(1)])
    qcol, krow = b.op("Unsqueeze", [q_pos, b.c([1])]), b.op("Unsqueeze", [k_pos, b.c([0])])
    allowed = b.op("LessOrEqual", [krow, qcol])
    if window:
        allowed = b.op("And", [allowed, b.op("Greater", [krow, b.op("Sub", [qcol, b.c(window)])])])
    pad = b.op("Unsqueeze", [b.op("Cast", ["attention_mask"], to=TensorProto.BOOL), b.c([1, 2])])
    keep = b.op("And", [b.op("Unsqueeze", [allowed, b.c([0, 1])]), pad])
    mask = b.op("Where", [keep, b.c(0.0, np.float32), b.c(mask_value, np.float32)])
    if square_mask:  # the rows of the new tokens: positions t - s .. t - 1
        first = b.op("Unsqueeze", [b.op("Sub", [t, s]), b.c([0])])
        mask = b.op("Slice", [mask, first, b.op("Unsqueeze", [t, b.c([0])]), b.c([2])])
    if alibi:
        dist = b.op("Cast", [b.op("Sub", [krow, qcol])], to=TensorProto.FLOAT)
        slopes = b.c(np.asarray([0.5, 0.25, 0.125, 0.0625], np.float32).reshape(1, HEADS, 1, 1), np.float32)
        mask = b.op("Add", [mask, b.op("Mul", [b.op("Unsqueeze", [dist, b.c([0, 1])]), slopes])])
    inv = (1.0 / 10000.0 ** (np.arange(0, HEAD, 2, dtype=np.float32) / HEAD)).astype(np.float32)
    freqs = b.op("Mul", [b.op("Unsqueeze", [b.op("Cast", ["position_ids"], to=TensorProto.FLOAT), b.c([2])]),
                         b.c(inv, np.float32)])
    emb = b.op("Concat", [freqs, freqs], axis=-1)
    cos = b.op("Unsqueeze", [b.op("Cos", [emb]), b.c([1])])
    sin = b.op("Unsqueeze", [b.op("Sin", [emb]), b.c([1])])

    def heads(x: str, n: int) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, b.c([0, 0, n, HEAD])])], perm=[0, 2, 1, 3])

    def rotate(x: str) -> str:
        x1, x2 = b.op("Split", [x], 2, axis=-1, num_outputs=2)
        half = b.op("Concat", [b.op("Neg", [x2]), x1], axis=-1)
        return b.op("Add", [b.op("Mul", [x, cos]), b.op("Mul", [half, sin])])

    def repeated(x: str) -> str:
        if repeat == "tiled":  # [g, kv, 1, T, D] -> [1, g * kv, T, D]: head h reads kv head h % kv
            wide = b.op("Expand", [b.op("Unsqueeze", [x, b.c([2])]), b.c([HEADS // KV, 1, 1, 1, 1])])
            return b.op("Reshape", [wide, b.c([1, HEADS, -1, HEAD])])
        wide = b.op("Expand", [b.op("Unsqueeze", [x, b.c([2])]), b.c([1, 1, HEADS // KV, 1, 1])])
        return b.op("Reshape", [wide, b.c([0, HEADS, -1, HEAD])])

    def scaled(x: str, by: float) -> str:
        return x if by == 1.0 else b.op("Mul", [x, b.c(by, np.float32)])

    x = b.op("Gather", [b.w(VOCAB, D, scale=1.0), "input_ids"])
    for i in range(layers):
        h = b.op("LayerNormalization", [x, b.w(D), b.w(D)], axis=-1, epsilon=1e-5)
        q = rotate(heads(b.op("MatMul", [h, b.w(D, D)]), HEADS))
        if q_bias:
            q = b.op("Add", [q, b.w(HEAD)])
        k = rotate(heads(b.op("MatMul", [h, b.w(D, KV * HEAD)]), KV))
        v = heads(b.op("MatMul", [h, b.w(D, KV * HEAD)]), KV)
        b.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.key", k], [f"present.{i}.key"], axis=2))
        b.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.value", v], [f"present.{i}.value"], axis=2))
        keys = repeated(f"present.{i}.key")
        if k_bias:
            keys = b.op("Add", [keys, b.w(HEAD)])
        if key_transposes:
            keys = b.op("Transpose", [b.op("Transpose", [keys], perm=[0, 2, 1, 3])], perm=[0, 2, 1, 3])
        kt = b.op("Transpose", [keys], perm=[0, 1, 3, 2])
        if scale_split:
            scores = b.op("MatMul", [scaled(q, scale ** 0.5), scaled(kt, scale ** 0.5)])
        else:
            scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.c(scale, np.float32)])
        if head_scales:
            scores = b.op("Mul", [scores, b.c(np.linspace(0.5, 2.0, HEADS).reshape(HEADS, 1, 1), np.float32)])
        if softcap:
            capped = b.op("Tanh", [b.op("Div", [scores, b.c(softcap_inner or softcap, np.float32)])])
            scores = b.op("Mul", [capped, b.c(softcap, np.float32)])
        if masked:
            scores = scaled(b.op("Add", [scores, mask]), post_scale)
        values = scaled(repeated(f"present.{i}.value"), v_scale)
        if v_bias:
            values = b.op("Add", [values, b.w(HEAD)])
        y = b.op("MatMul", [b.op("Softmax", [scores], axis=softmax_axis), values])
        y = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.c([0, 0, D])])
        x = b.op("Add", [x, b.op("MatMul", [y, b.w(D, D)])])
        f = b.op("Relu", [b.op("MatMul", [b.op("LayerNormalization", [x, b.w(D)], axis=-1), b.w(D, FF)])])
        x = b.op("Add", [x, b.op("MatMul", [f, b.w(FF, D)])])
    logits = b.op("MatMul", [x, b.w(D, VOCAB)])
    b.rename(logits, "logits")
    past, presents = cache_io(layers)
    inputs = [ids_input("input_ids", "sequence_length"), ids_input("attention_mask", "total_sequence_length"),
              ids_input("position_ids", "sequence_length"), *past]
    return b.model(inputs, ["logits", *presents], opset=18)


def llama_config(context: int) -> dict[str, Any]:
    """A config.json for :func:`exported_like`'s sizes (what an Optimum export ships beside the model)."""
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": D, "intermediate_size": FF,
            "num_attention_heads": HEADS, "num_key_value_heads": KV, "num_hidden_layers": 2, "vocab_size": VOCAB,
            "max_position_embeddings": context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


# --- the two greedy loops -------------------------------------------------------------------------------------
def ort_greedy(path: Path, prompt: list[int], n: int, layers: int, positions: bool) -> tuple[list[int], list[Any]]:
    past = {f"past_key_values.{i}.{t}": np.zeros((1, KV, 0, HEAD), np.float32) for i in range(layers)
            for t in ("key", "value")}
    ids, out, logits = list(prompt), [], []
    feed_ids = ids
    for _ in range(n):
        total = sum(int(v.shape[2]) for k, v in past.items() if k.endswith("0.key")) + len(feed_ids)
        feeds: dict[str, np.ndarray] = {"input_ids": np.asarray([feed_ids], np.int64),
                                        "attention_mask": np.ones((1, total), np.int64), **past}
        if positions:
            feeds["position_ids"] = np.arange(total - len(feed_ids), total, dtype=np.int64)[None]
        res = ort_run(path, feeds)
        logits.append(res["logits"][0])
        tok = int(np.argmax(res["logits"][0, -1]))
        out.append(tok)
        past = {k: res[k.replace("past_key_values", "present")] for k in past}
        feed_ids = [tok]
    return out, logits


def mapped(path: Path) -> tuple[KVPlan, ImportedGraph]:
    f = open_onnx(path)
    plan = prepare_kv(f)
    imported = plan.finish(import_graph(plan.file, internal=plan.mapped))
    check(imported.graph, source=str(path))
    return plan, imported


def ir_greedy(imported: ImportedGraph, prompt: list[int], n: int, chunks: tuple[int, ...] = ()) -> tuple[
        list[int], list[Any]]:
    g = imported.graph
    layers = kv_layers(g)
    state = {nm: np.zeros((0, la.n_kv_heads, la.k_dim), np.float32) for la in layers for nm in (la.past_k, la.past_v)}
    weights = weights_of(imported)
    pos, out, logits = 0, [], []
    pieces = [prompt[a:b] for a, b in zip((0, *np.cumsum(chunks)), (*np.cumsum(chunks), len(prompt)), strict=True)
              if b > a] if chunks else [prompt]
    for piece in pieces[:-1]:  # a chunked prefill: the cache grows a chunk at a time
        res = step(g, weights, piece, pos, state, layers)
        pos += len(piece)
    feed = pieces[-1]
    for _ in range(n):
        res = step(g, weights, feed, pos, state, layers)
        pos += len(feed)
        logits.append(res["logits"])
        tok = int(np.argmax(res["logits"][-1]))
        out.append(tok)
        feed = [tok]
    return out, logits


def step(g: Graph, weights: Any, ids: list[int], pos: int, state: dict[str, np.ndarray], layers: Any) -> Any:
    feeds = {"tokens": np.asarray(ids, np.int64), "positions": np.arange(pos, pos + len(ids), dtype=np.int64),
             **state}
    res = evaluate(g, feeds, weights)
    for la in layers:
        state[la.past_k], state[la.past_v] = res[la.present_k], res[la.present_v]
    return res


def save(tmp_path: Path, model: Any) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def causal_fixtures() -> list[tuple[Path, dict[str, Any]]]:
    """H4's causal-kv fixtures with greedy references, as (model file, manifest entry). Called inside a test, never
    at collection: the first call generates the fixtures (minutes). Skips when the generator cannot run here."""
    try:
        from onnx_fixture_support import manifest, onnx_fixtures_dir
    except ImportError:
        pytest.skip("tests/loaders/onnx_fixture_support.py (H4's fixtures) is not in this tree")
    entries, base = manifest(), onnx_fixtures_dir()
    if isinstance(entries, dict):  # the manifest document rather than its list
        entries = entries.get("fixtures", [])
    found = [(Path(base) / e["file"], e) for e in entries if e.get("kind") == "causal-kv" and e.get("greedy")]
    if not found:
        pytest.fail("the fixture manifest has no causal-kv entry with a greedy reference")
    return found
