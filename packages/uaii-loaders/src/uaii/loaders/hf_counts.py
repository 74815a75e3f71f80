"""A Hugging Face config.json's sizes checked against the checkpoint's tensors, before anything per layer is built.

The HF twin of :mod:`uaii.loaders.gguf_counts`. The normalizer and the builders size loops and tables by the
config (layers, experts, heads, widths); a config is small and hand-edited, and its numbers used to be trusted:
``num_hidden_layers: 1e9`` built 7.8 GB of per-layer tuples, a config with fewer layers than the checkpoint
silently dropped the rest, and a wrong ``vocab_size`` was overridden without a word. Each size a tensor shape
can confirm is compared with it, on canonical names (:mod:`uaii.loaders.names`): the loader checks the weights
``WeightSet.from_hf`` mapped (one mapping for both), before :func:`~uaii.loaders.hf_config.from_hf` sizes
anything by the config, in this order:

* ``num_hidden_layers`` (``n_layer``) = the layers the tensors hold, numbered from 0 without a gap — read raw,
  before any bound, so that the message says what the checkpoint has;
* ``num_local_experts`` / ``num_experts`` = the experts of every layer and projection;
* ``hidden_size`` = the embedding's width, ``vocab_size`` its rows;
* heads x head size = the rows of every layer's q, k, v (or fused qkv) projection;
* ``intermediate_size`` (phi3: twice, gate and up fused), ``moe_intermediate_size`` and
  ``shared_expert_intermediate_size`` = the rows of the up projections;
* ``n_positions`` / ``max_position_embeddings`` at most the rows of a learned position table (GPT-2, BERT).

Failures are LoaderErrors naming config.json, the key, its value and the tensor that contradicts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

from .config import _Src
from .errors import LoaderError
from .hf_config import Sizes, language_config, sizes
from .names import BANK, experts_per_projection, layer_numbers
from .weights import Weight

_MOE = frozenset({"mixtral", "qwen2moe", "qwen3moe"})


def check_counts(config: Mapping[str, Any], arch: str, weights: Mapping[str, Weight], where: str) -> None:
    """Fail on the first size in ``config`` that the ``weights`` of architecture ``arch`` (canonical names, as
    :meth:`WeightSet.from_hf <uaii.loaders.weights.WeightSet.from_hf>` maps them) contradict."""
    c = _Counts(_Src(language_config(config), where), arch, weights)
    n_layers = c.layers()
    c.experts()
    s = sizes(c.c, arch)  # bounded; the layer count is the checkpoint's now
    c.embedding(s)
    c.attention(s, n_layers)
    c.feed_forward(s, n_layers)
    c.positions(s)


def _has_shape(w: Weight) -> str:
    return f"{w.info.name!r} has shape {list(w.info.shape)}"


class _Counts:
    def __init__(self, c: _Src, arch: str, canon: Mapping[str, Weight]) -> None:
        self.c, self.arch, self.canon = c, arch, canon

    def count(self, key: str) -> int | None:
        """An integral number (JSON may write 1e9 as a float); anything else is left for from_hf to report."""
        v = self.c.raw(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
            return None
        return int(v)

    def fail(self, key: str, value: Any, found: str) -> NoReturn:
        raise LoaderError(f"{self.c.where}: {key} = {value}, but {found}")

    def layers(self) -> int:
        key = "n_layer" if self.arch == "gpt2" else "num_hidden_layers"
        n = self.count(key)
        found = layer_numbers(self.canon)
        if n is None:
            return len(found)
        if n != len(found) or (found and found[-1] + 1 != len(found)):
            gap = next((i for i, layer in enumerate(found) if i != layer), None)
            self.fail(key, n, f"the checkpoint holds {len(found)} layers"
                      + (f" (numbered 0 to {found[-1]})" if gap is None and found else "")
                      + (f" (layer {gap} has no tensors)" if gap is not None else ""))
        return n

    def experts(self) -> None:
        if self.arch not in _MOE:
            return
        key = "num_local_experts" if self.c.raw("num_local_experts") is not None else "num_experts"
        n = self.count(key)
        if n is None:
            return
        per = experts_per_projection(self.canon)
        for name, w in self.canon.items():  # mlx-lm's stacked experts (switch_mlp): one bank per projection
            if (m := BANK.match(name)) and len(w.shape) == 3:
                per[(name.split(".")[1], m.group(1))] = w.shape[0]
        if not per:
            self.fail(key, n, "the checkpoint holds no expert tensors (mlp.experts.E.* or mlp.switch_mlp.*)")
        for (layer, proj), count in sorted(per.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
            if count != n:
                self.fail(key, n, f"the checkpoint holds {count} experts (layer {layer}, {proj} projection)")

    def embedding(self, s: Sizes) -> None:
        emb = self.canon.get("token_embd.weight")
        if emb is None or len(emb.info.shape) != 2:
            return  # the builder names the missing tensor
        rows, width = emb.logical_shape
        if width != s.d_model:
            self.fail(s.keys["d_model"], s.d_model, _has_shape(emb))
        vocab = self.count("vocab_size")
        if vocab is not None and vocab != rows:
            self.fail("vocab_size", vocab, f"the embedding {emb.info.name!r} holds {rows} rows")

    def attention(self, s: Sizes, n_layers: int) -> None:
        k, hd = s.keys, s.head_dim
        size = f"{k['head_dim']} {hd}"
        want = {"attn_q": (k["n_heads"], s.n_heads, s.n_heads * hd, f"{k['n_heads']} {s.n_heads} x {size}"),
                "attn_k": (k["n_kv_heads"], s.n_kv_heads, s.n_kv_heads * hd,
                           f"{k['n_kv_heads']} {s.n_kv_heads} x {size}"),
                "attn_v": (k["n_kv_heads"], s.n_kv_heads, s.n_kv_heads * hd,
                           f"{k['n_kv_heads']} {s.n_kv_heads} x {size}"),
                "attn_qkv": (k["n_heads"], s.n_heads, (s.n_heads + 2 * s.n_kv_heads) * hd,
                             f"({k['n_heads']} {s.n_heads} + 2 x {k['n_kv_heads']} {s.n_kv_heads}) x {size}")}
        for i in range(n_layers):
            for proj, (key, value, rows, why) in want.items():
                t = self.canon.get(f"blk.{i}.{proj}.weight")
                if t is not None and t.rows != rows:
                    self.fail(key, value, f"{_has_shape(t)}, not {rows} rows ({why})")

    def feed_forward(self, s: Sizes, n_layers: int) -> None:
        fused = self.arch == "phi3"  # gate_up_proj: [gate; up]
        dense = ("ffn_up", s.keys["d_ff"], s.d_ff, 2 * s.d_ff if fused else s.d_ff)
        expert_key = "intermediate_size" if self.arch == "mixtral" else "moe_intermediate_size"
        expert = self.count(expert_key)
        shared = self.count("shared_expert_intermediate_size")
        for i in range(n_layers):
            for name, key, value, rows in (dense, ("ffn_up.0", expert_key, expert, expert),
                                           ("ffn_up_shexp", "shared_expert_intermediate_size", shared, shared)):
                t = self.canon.get(f"blk.{i}.{name}.weight")
                if value and t is not None and t.rows != rows:
                    why = " (gate and up fused)" if fused and name == "ffn_up" else ""
                    self.fail(key, value, f"{_has_shape(t)}, not {rows} rows{why}")

    def positions(self, s: Sizes) -> None:
        pos = self.canon.get("position_embd.weight")
        if pos is not None and s.context > pos.info.shape[0]:
            self.fail(s.keys["context"], s.context, f"{_has_shape(pos)}: one row per position")


__all__ = ["check_counts"]
