"""Graph assembly for the architecture builders: declare values, emit nodes, and the blocks models share.

Activations are f32 ``[seq, d_model]`` (one sequence, no batch axis); heads are split ``[seq, heads,
head_dim]`` as the Attention op expects. Every value is declared with its shape, symbolic where it depends on
``seq`` or ``past``, so the validator checks the builder's bookkeeping against its own shape inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from uaii.ir import Dim, DType, Graph, GraphError, Node, Tensor, make_graph
from uaii.ir.ops import Op
from uaii.ir.shapes import dim_add

from ..config import ModelConfig
from ..errors import LoaderError
from ..weights import Weight, WeightSet

SEQ = "seq"
PAST = "past"
ACT = DType.F32


class GraphBuilder:
    """Collects tensors and nodes; ``op`` declares the outputs it creates."""

    def __init__(self, cfg: ModelConfig, ws: WeightSet) -> None:
        self.cfg, self.ws = cfg, ws
        self.nodes: list[Node] = []
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    # --- declarations ---------------------------------------------------------------------------------------
    def _declare(self, t: Tensor) -> str:
        old = self.tensors.get(t.name)
        if old is not None and old != t:
            raise GraphError(f"value {t.name!r} declared twice with different types")
        self.tensors[t.name] = t
        return t.name

    def input(self, name: str, dtype: DType, shape: Sequence[Dim]) -> str:
        self.inputs.append(self._declare(Tensor(name, dtype, tuple(shape))))
        return name

    def output(self, name: str) -> None:
        self.outputs.append(name)

    def weight(self, w: Weight) -> str:
        return self._declare(Tensor(w.name, w.info.dtype, w.info.shape, weight=w.ref))

    def matrix(self, w: Weight) -> tuple[str, int]:
        """Declare a MatMul weight; returns its name and output features. A 1-D weight (GGUF may store a
        ``[1, d]`` gate as ``[d]``) is declared ``[1, d]``: the bytes are the same, and it is one row."""
        shape = w.info.shape if len(w.info.shape) > 1 else (1, *w.info.shape)
        name = self._declare(Tensor(w.name, w.info.dtype, shape, weight=w.ref))
        return name, w.rows if w.transposed or len(w.info.shape) > 1 else 1

    def constant(self, name: str, array: np.ndarray) -> str:
        return self._declare(Tensor.constant(name, array))

    def shape_of(self, name: str) -> tuple[Dim, ...]:
        return self.tensors[name].shape

    def op(self, op: str, inputs: Sequence[str], out: str, shape: Sequence[Dim], /, *, dtype: DType = ACT,
           extra_outputs: Sequence[tuple[str, DType, Sequence[Dim]]] = (), **attrs: Any) -> str:
        """Emit one node; its first output is ``out`` with ``shape``; more outputs via ``extra_outputs``."""
        if out in self.tensors:
            raise GraphError(f"value {out!r} produced twice")
        self._declare(Tensor(out, dtype, tuple(shape)))
        names = [out]
        for name, dt, shp in extra_outputs:
            names.append(self._declare(Tensor(name, dt, tuple(shp))))
        self.nodes.append(Node(f"{out}/{op}", op, tuple(inputs), tuple(names), tuple(attrs.items())))
        return out

    def graph(self, name: str, metadata: dict[str, str]) -> Graph:
        return make_graph(name, self.nodes, self.tensors.values(), self.inputs, self.outputs, metadata,
                          producer="uaii-loaders")

    # --- shared blocks --------------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.ws

    def linear(self, x: str, wname: str, out: str, bias: str | None = None) -> str:
        """``x @ W^T (+ b)``; W is ``[out, in]`` (or ``[in, out]`` when stored transposed, GPT-2 Conv1D), or an
        MLX-quantized ``[out, in]`` kept packed (QuantizedMatMul)."""
        w = self.ws.need(wname)
        rows = self.shape_of(x)[:-1]
        b = self.ws.get(bias) if bias is not None else None
        mm = out if b is None else out + ".mm"
        if w.quant is not None:
            k = self.shape_of(x)[-1]
            if k != w.quant.cols:
                raise LoaderError(f"{self.ws.where}: {w.info.name!r} packs rows of {w.quant.cols} values; its input "
                                  f"{x!r} has {k}")
            y = self.op(Op.QUANTIZED_MATMUL, [x, *self.quantized(w)], mm, (*rows, w.rows), K=w.quant.cols,
                        N=w.rows, **w.quant.params.attrs())
        else:
            wt, n_out = self.matrix(w)
            y = self.op(Op.MATMUL, [x, wt], mm, (*rows, n_out), transpose_b=not w.transposed)
        if b is not None:
            y = self.op(Op.ADD, [y, self.f32(self.weight(b))], out, self.shape_of(y))
        return y


    def embedding(self, indices: str, wname: str, out: str, d: int) -> str:
        """Rows of the table ``wname`` as f32 ``[seq, d]``: an Embedding (a GGUF block type dequantizes, a float table
        is cast), or a QuantizedEmbedding of an MLX-quantized table."""
        table = self.ws.need(wname)
        if table.quant is not None:
            return self.op(Op.QUANTIZED_EMBEDDING, [indices, *self.quantized(table)], out, (SEQ, d),
                           dim=table.quant.cols, **table.quant.params.attrs())
        dt = table.info.dtype
        y = self.op(Op.EMBEDDING, [indices, self.weight(table)], out, (SEQ, d), dtype=ACT if dt.is_quantized else dt)
        if not dt.is_quantized and dt is not ACT:
            y = self.op(Op.CAST, [y], out + ".f32", (SEQ, d), to=ACT.value)
        return y

    def quantized(self, w: Weight) -> list[str]:
        """An MLX-quantized weight's inputs: packed values, scales and (affine) biases, declared."""
        assert w.quant is not None
        stem = w.name.rsplit(".", 1)[0]
        parts = ("scales", "biases") if w.quant.has_biases else ("scales",)
        return [self.weight(w), *(self.weight(self.ws.need(f"{stem}.{part}")) for part in parts)]

    def f32(self, name: str) -> str:
        """``name`` as f32: a Cast node for f16/bf16 weights that meet f32 activations in binary ops."""
        t = self.tensors[name]
        if t.dtype is ACT:
            return name
        return self.op(Op.CAST, [name], f"{name}.f32", t.shape, to=ACT.value)

    def rms_norm(self, x: str, wname: str, out: str, eps: float | None = None) -> str:
        w = self.weight(self.ws.need(wname))
        return self.op(Op.RMS_NORM, [x, w], out, self.shape_of(x), eps=float(self.cfg.norm_eps if eps is None
                                                                                 else eps),
                       add_unit_offset=self.cfg.norm_unit_offset)

    def layer_norm(self, x: str, prefix: str, out: str) -> str:
        ins = [x, self.weight(self.ws.need(f"{prefix}.weight"))]
        if f"{prefix}.bias" in self.ws:
            ins.append(self.weight(self.ws.need(f"{prefix}.bias")))
        return self.op(Op.LAYER_NORM, ins, out, self.shape_of(x), eps=float(self.cfg.norm_eps))

    def add(self, a: str, b: str, out: str) -> str:
        return self.op(Op.ADD, [a, b], out, self.shape_of(a))

    def heads(self, x: str, n: int, out: str) -> str:
        """``[seq, n * head_dim]`` → ``[seq, n, head_dim]``."""
        hd = self.cfg.head_dim
        return self.op(Op.RESHAPE, [x], out, (*self.shape_of(x)[:-1], n, hd), shape=(0, n, hd))

    def merge_heads(self, x: str, out: str) -> str:
        s = self.shape_of(x)
        merged = int(s[-2]) * int(s[-1])
        return self.op(Op.RESHAPE, [x], out, (*s[:-2], merged), shape=(0, merged))


    def kv_cache(self, layer: int) -> tuple[str, str, str, str]:
        """Declare the layer's cache inputs ``past_k.N``/``past_v.N``; return them and the present names."""
        shape = (PAST, self.cfg.n_kv_heads, self.cfg.head_dim)
        pk = self.input(f"past_k.{layer}", ACT, shape)
        pv = self.input(f"past_v.{layer}", ACT, shape)
        return pk, pv, f"present_k.{layer}", f"present_v.{layer}"

    def attention(self, q: str, k: str, v: str, layer: int, out: str, *, cache: bool = True,
                  **attrs: Any) -> str:
        cfg = self.cfg
        q_shape = self.shape_of(q)
        if not cache:
            return self.op(Op.ATTENTION, [q, k, v], out, q_shape, n_heads=cfg.n_heads,
                           n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, **attrs)
        pk, pv, nk, nv = self.kv_cache(layer)
        total = (dim_add(PAST, SEQ), cfg.n_kv_heads, cfg.head_dim)
        y = self.op(Op.ATTENTION, [q, k, v, pk, pv], out, q_shape,
                    extra_outputs=[(nk, ACT, total), (nv, ACT, total)], n_heads=cfg.n_heads,
                    n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, **attrs)
        self.output(nk)
        self.output(nv)
        return y


def require_weights(ws: WeightSet, names: Sequence[str], arch: str) -> None:
    missing = [n for n in names if n not in ws]
    if missing:
        raise LoaderError(f"{ws.where}: a {arch} model needs tensors {', '.join(missing[:4])}"
                          + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))


__all__ = ["ACT", "PAST", "SEQ", "GraphBuilder", "require_weights"]
