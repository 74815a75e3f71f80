"""GGUF metadata counts checked against the tensors of the file, before anything is built per layer.

The config normalizer and the builders size loops and tables by the counts in the metadata (``block_count``,
head counts, expert counts, embedding and feed-forward lengths, context length). GGUF has no checksums, so a
flipped bit in one of them used to be trusted: ``gemma3.block_count`` 18 -> 2^26 + 18 built per-layer tables
for 69 s and 600 MB before the builder noticed that layer 18 has no tensors. Here each count that a tensor
shape can confirm is compared with it — a handful of dictionary lookups per layer, on the layers the tensor
table proves to exist — and the rest are bounded (:mod:`uaii.loaders.limits`). Failures are LoaderErrors that
name the file, the key, its value and what the tensors say.

Checked (``<arch>.`` keys): ``block_count`` = 1 + the highest ``blk.N`` and every layer below it has tensors;
per-layer arrays have ``block_count`` entries; ``embedding_length`` = the width of ``token_embd.weight``;
``vocab_size`` = its rows, and ``tokenizer.ggml.tokens`` has no more entries than it has rows; head counts x head
sizes = the rows of every layer's ``attn_q``/``attn_k``/``attn_v``/``attn_qkv``; feed-forward lengths = the
inner dimension of ``ffn_down`` (dense, ``_exps``, ``_shexp``); ``expert_count`` = the experts of every bank,
and experts exist when it is set (and only then); ``context_length`` at most the rows of ``position_embd``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from .errors import LoaderError
from .index import TensorInfo
from .limits import MAX_CONTEXT, MAX_EXPERTS, check_count
from .names import BANK, experts_per_projection, layer_numbers

_PER_LAYER = ("attention.head_count", "attention.head_count_kv", "feed_forward_length",
              "attention.sliding_window_pattern")


def check_counts(meta: Mapping[str, Any], tensors: Mapping[str, TensorInfo], where: str) -> None:
    """Fail on the first count in ``meta`` that the ``tensors`` (GGUF names) contradict."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return  # from_gguf names that problem
    c = _Counts(meta, tensors, where, arch + ".")
    n_layers = c.layers()
    c.per_layer_arrays(n_layers)
    c.vocabulary()
    c.heads(n_layers)
    c.feed_forward(n_layers)
    c.experts()
    c.context()


class _Counts:
    def __init__(self, meta: Mapping[str, Any], tensors: Mapping[str, TensorInfo], where: str,
                 prefix: str) -> None:
        self.meta, self.tensors, self.where, self.prefix = meta, tensors, where, prefix

    def count(self, key: str) -> int | None:
        """An integer setting; a per-layer array counts when all its entries agree. Anything else is None:
        from_gguf reports missing, mistyped or varying settings with its own messages."""
        v = self.meta.get(self.prefix + key)
        if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu" and len(v):
            first = v[0]
            v = int(first) if (v == first).all() else None
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer) or v < 0:
            return None
        return int(v)

    def fail(self, key: str, value: Any, found: str) -> NoReturn:
        raise LoaderError(f"{self.where}: {self.prefix}{key} is {value}, but {found}")

    # --- the checks -----------------------------------------------------------------------------------------
    def layers(self) -> int:
        n = self.count("block_count")
        if n is None:
            return 0
        found = layer_numbers(self.tensors)
        if not found:
            if n:
                self.fail("block_count", n, "the file has no layer tensors (blk.N.*)")
            return 0
        if found[-1] + 1 != n:
            self.fail("block_count", n, f"the tensors hold layers up to blk.{found[-1]} ({len(found)} layers)")
        if len(found) != n:
            holes = [i for a, b in zip([-1, *found], found, strict=False) for i in range(a + 1, min(b, a + 4))]
            self.fail("block_count", n, f"layers {', '.join(f'blk.{i}' for i in holes[:3])} have no tensors")
        return n

    def per_layer_arrays(self, n_layers: int) -> None:
        for key in _PER_LAYER:
            v = self.meta.get(self.prefix + key)
            if isinstance(v, np.ndarray) and v.ndim == 1 and len(v) != n_layers:
                self.fail(key, f"an array of {len(v)} entries", f"{self.prefix}block_count is {n_layers}")

    def vocabulary(self) -> None:
        emb = self.tensors.get("token_embd.weight")
        if emb is None or len(emb.shape) != 2:
            return  # the builder names the missing tensor
        rows, width = emb.shape
        d = self.count("embedding_length")
        if d is not None and d != width:
            self.fail("embedding_length", d, f"token_embd.weight has shape {list(emb.shape)}")
        vocab = self.count("vocab_size")
        if vocab is not None and vocab != rows:
            self.fail("vocab_size", vocab, f"token_embd.weight has shape {list(emb.shape)}")
        tokens = self.meta.get("tokenizer.ggml.tokens")
        if tokens is not None and len(tokens) > rows:
            raise LoaderError(f"{self.where}: tokenizer.ggml.tokens has {len(tokens)} tokens, but "
                              f"token_embd.weight has only {rows} rows: ids from {rows} on have no embedding")

    def heads(self, n_layers: int) -> None:
        """Head counts x head sizes = the rows of every attention projection. The message names every key that
        went into the expected number: with no ``key_length`` the head size is derived from the head count, so a
        flipped ``head_count`` may show up in the K rows."""
        n_heads, d = self.count("attention.head_count"), self.count("embedding_length")
        if not n_heads or not d:
            return
        p = self.prefix
        n_kv = self.count("attention.head_count_kv") or n_heads
        key_len = self.count("attention.key_length")
        hd_k = key_len or d // n_heads
        hd_v = self.count("attention.value_length") or hd_k
        size = f"head size {hd_k} " + (f"({p}attention.key_length)" if key_len else
                                        f"({p}embedding_length {d} / {p}attention.head_count {n_heads})")
        q = f"{p}attention.head_count {n_heads}"
        kv = f"{p}attention.head_count_kv {n_kv}"
        want = {"attn_q": (n_heads * hd_k, f"{q} x {size}"),
                "attn_k": (n_kv * hd_k, f"{kv} x {size}"),
                "attn_v": (n_kv * hd_v, f"{kv} x value size {hd_v}"),
                "attn_qkv": (n_heads * hd_k + n_kv * (hd_k + hd_v), f"({q} + 2 x {kv}) x {size}")}
        for i in range(n_layers):
            for proj, (rows, why) in want.items():
                t = self.tensors.get(f"blk.{i}.{proj}.weight")
                if t is not None and t.shape[0] != rows:
                    raise LoaderError(f"{self.where}: blk.{i}.{proj}.weight has shape {list(t.shape)}, but the "
                                      f"metadata says {rows} rows: {why}")

    def feed_forward(self, n_layers: int) -> None:
        ff = self.count("feed_forward_length")
        ff_exp = self.count("expert_feed_forward_length")
        sizes = {"ffn_down": ("feed_forward_length", ff),
                 "ffn_down_exps": ("expert_feed_forward_length" if ff_exp else "feed_forward_length", ff_exp or ff),
                 "ffn_down_shexp": ("expert_shared_feed_forward_length",
                                    self.count("expert_shared_feed_forward_length"))}
        for i in range(n_layers):
            for proj, (key, value) in sizes.items():
                t = self.tensors.get(f"blk.{i}.{proj}.weight")
                if value and t is not None and t.shape[-1] != value:
                    self.fail(key, value, f"blk.{i}.{proj}.weight has shape {list(t.shape)}")

    def experts(self) -> None:
        n = self.count("expert_count") or 0
        check_count(n, MAX_EXPERTS, self.prefix + "expert_count", self.where)
        banks = {name: t for name, t in self.tensors.items() if BANK.match(name)}
        per_expert = experts_per_projection(self.tensors)  # one tensor per expert (old GGUFs)
        if not n:
            if banks or per_expert:
                self.fail("expert_count", "absent or 0", f"the file holds expert tensors, e.g. "
                                                        f"{next(iter(banks), None) or 'blk.N.ffn_gate.E.weight'}")
            return
        if not banks and not per_expert:
            self.fail("expert_count", n, "the file holds no expert tensors (blk.N.ffn_gate_exps.weight)")
        for name, t in banks.items():
            if t.shape[0] != n:
                self.fail("expert_count", n, f"bank {name} has shape {list(t.shape)} (experts first)")
        for (layer, proj), count in per_expert.items():
            if count != n:
                self.fail("expert_count", n, f"layer {layer} numbers its ffn_{proj} experts up to {count - 1}")

    def context(self) -> None:
        ctx = self.count("context_length")
        if ctx is None:
            return
        check_count(ctx, MAX_CONTEXT, self.prefix + "context_length", self.where)
        pos = self.tensors.get("position_embd.weight")
        if pos is not None and ctx > pos.shape[0]:
            self.fail("context_length", ctx, f"position_embd.weight has shape {list(pos.shape)}: one row per "
                                             "position")


__all__ = ["check_counts"]
