"""The KV-cache mapping: a causal LM's ``past_key_values``/``present`` I/O as the IR's KV convention.

An exported decoder takes its cache as graph inputs ``past_key_values.N.key/value`` ``[batch, kv_heads, past,
head]`` and returns ``present.N.key/value``; the caller concatenates nothing, the graph does. The runtime generates
with a KV *state* instead (the backend appends in place, keeps a window plus sinks, re-rotates keys): it needs each
layer as one IR Attention whose ``past_k``/``past_v`` are graph inputs ``[past, kv_heads, head]`` and whose
presents are graph outputs, with no mask (``uaii.ir.kvcache``), and the inputs ``tokens``/``positions`` ``[seq]``.

So before import the ONNX graph is rewritten (batch 1, as generation runs):

* inputs: ``tokens`` -> ``input_ids`` = Unsqueeze(tokens), ``positions`` -> ``position_ids``; ``attention_mask``
  becomes all ones of ``[1, past + seq]`` (generation never pads); ``past_k.N`` -> ``past_key_values.N.key`` =
  Transpose(Unsqueeze(past_k.N)) for whatever still reads the old cache (shape arithmetic);
* each layer's attention becomes one node of the internal ``uaii.kv`` domain (:mod:`.contrib_attention`): a
  GroupQueryAttention keeps its attributes and takes the new cache and positions; an exporter's MatMul/Softmax
  attention (:mod:`.kv_match`) becomes ``uaii.kv::Attention`` with the scale and soft-cap it had, its masks kept
  only as *probes*;
* outputs: ``logits`` = Squeeze(batch) first, then ``present_k.N``/``present_v.N``; nodes nothing needs are dropped
  (the mask and ``seqlens_k`` arithmetic).

After import, :meth:`KVPlan.finish` evaluates the probes with uaii.ir's reference for a few (seq, past) sizes and
one at the model's whole context (:mod:`.kv_verify`), and requires each to be what the IR Attention does: the masks
exactly a causal mask (with a sliding window, which it sets on the layer) — the mapping drops them and the IR
Attention re-creates them, so it must prove they were nothing else (padding needs batches, ALiBi is a bias, not a
mask) —, a head repeat that repeats each kv head in place, and a GroupQueryAttention's seqlens_k /
total_sequence_length / position_ids those of an unpadded sequence. When it cannot, the model is imported again
without the mapping. Either way the graph metadata ``onnx.kv`` says what happened: ``mapped: <kinds>`` or
``none: <reason>`` — the reason ``uaii run`` gives for not decoding incrementally.

The context the masks are checked at is the one the runtime will hold the model to (``config.json`` beside the
model, else the rows of the rotary caches, as the loader reads them); when the model tells none, the masks are
checked at :data:`~.kv_verify.DEFAULT_CONTEXT` tokens and ``context_length`` says so, so that no sequence runs past
what was checked (a sliding window longer than that would not show).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from uaii.ir import needed_nodes

from .contrib_attention import KV_ATTENTION, KV_DOMAIN, KV_GQA, POSITIONS_SLOT
from .dispatch import MS_DOMAIN
from .importer import ImportedGraph
from .kv_match import (
    MASK_KINDS,
    GraphIndex,
    NoMatch,
    Probe,
    Region,
    attr,
    match_attention,
    match_kv_concat,
    softmaxes,
    through_identity,
)
from .onnx_api import onnx_module

PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
TOKENS, POSITIONS = "tokens", "positions"
KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids"})


class NotMappable(Exception):
    """Why a model's KV I/O does not map (the message is what ``uaii run`` says)."""


@dataclass(frozen=True)
class Layer:
    """One cached layer: its index, cache shape and the probes its attention had (:class:`~.kv_match.Probe`)."""

    index: int
    kind: str  # "gqa" | "attention"
    kv_heads: int
    head_dim: int
    probes: tuple[Probe, ...] = ()
    v_head_dim: int = 0  # values' head size where it differs from the keys'

    @property
    def present_k(self) -> str:
        return f"present_k.{self.index}"

    @property
    def masked(self) -> bool:
        return any(p.kind in MASK_KINDS for p in self.probes)


@dataclass(frozen=True)
class KVPlan:
    """What :func:`prepare_kv` decided: import ``file``, then :meth:`finish` the result."""

    source: Any  # the OnnxFile as read
    file: Any  # the OnnxFile to import: ``source``, or a copy with the rewritten graph
    reason: str = ""  # why the model is not mapped ("" when it is)
    layers: tuple[Layer, ...] = ()
    context_length: int = 0
    dtypes: Mapping[str, int] = field(default_factory=dict)  # past input -> ONNX element type

    @property
    def mapped(self) -> bool:
        return not self.reason

    def finish(self, imported: ImportedGraph) -> ImportedGraph:
        """``imported`` (the import of :attr:`file`) with the probes verified and removed and metadata ``onnx.kv``
        set (and ``context_length`` to the length the masks were checked at when the model tells none); the
        unmapped import of :attr:`source` when a probe was not what the mapping assumes."""
        from .kv_verify import DEFAULT_CONTEXT, verify_layers

        meta = {"context_length": str(self.context_length)} if self.context_length else {}
        if not self.mapped:
            return _with_meta(imported, {**meta, "onnx.kv": f"none: {self.reason}"})
        context = self._context(_with_meta(imported, meta))
        checked = context or (DEFAULT_CONTEXT if any(la.masked for la in self.layers) else 0)
        try:
            graph = verify_layers(imported.graph, self.layers, checked)
        except NotMappable as exc:
            from .dispatch import OnnxImportError
            from .importer import import_graph

            try:
                again = import_graph(self.source, name=imported.graph.name)
            except OnnxImportError as failed:  # say why the mapped graph was not used, too
                raise OnnxImportError(f"{failed} (the KV-cache mapping was not applied: {exc})") from None
            return _with_meta(again, {**meta, "onnx.kv": f"none: {exc}"})
        if checked != context:  # the masks were checked this far: no sequence may run past it
            meta["context_length"] = str(checked)
        kinds = "+".join(sorted({la.kind for la in self.layers}))
        return _with_meta(replace(imported, graph=graph), {**meta, "onnx.kv": f"mapped: {kinds}"})

    def _context(self, imported: ImportedGraph) -> int:
        """The context the loader gives the model (config.json beside it, else ``context_length``): the runtime
        runs no sequence past it, so the masks are checked up to it. 0 when nothing tells it."""
        from uaii.ir import UaiiError

        from .loader import model_config

        try:
            return int(model_config(Path(self.source.path).parent, imported.graph).context_length or 0)
        except UaiiError:  # an unreadable config.json: the loader reports it; the masks use what the graph says
            return self.context_length


def _with_meta(imported: ImportedGraph, extra: Mapping[str, str]) -> ImportedGraph:
    g = imported.graph
    return replace(imported, graph=replace(g, metadata=tuple({**g.meta, **extra}.items())))


def prepare_kv(f: Any) -> KVPlan:
    """The plan for the OnnxFile ``f``: a rewritten copy to import when its KV I/O maps, else ``f`` and why not."""
    try:
        return _Rewrite(f).run()
    except NotMappable as exc:
        return KVPlan(f, f, str(exc) or "not a causal LM with a KV cache")
    except (KeyError, IndexError, ValueError, TypeError) as exc:  # a graph shaped unlike any the mapping knows
        return KVPlan(f, f, f"the KV mapping cannot follow this graph ({type(exc).__name__}: {exc})")


# --- the rewrite ------------------------------------------------------------------------------------------------
class _Rewrite:
    def __init__(self, f: Any) -> None:
        onnx = onnx_module()
        self.f, self.onnx, self.helper = f, onnx, onnx.helper
        self.model = onnx.ModelProto()
        self.model.CopyFrom(f.model)
        self.g = self.model.graph
        inits = {t.name for t in self.g.initializer}
        self.inputs = {vi.name: vi for vi in self.g.input if vi.name not in inits}
        self.outputs = [vo.name for vo in self.g.output]
        self.index = GraphIndex(self.g.node, self._const, int(f.opsets.get("", 0)))
        self.new_nodes: list[Any] = []
        self.dead: set[int] = set()  # ids of nodes replaced
        self.context = 0
        self.failures: dict[str, str] = {}  # keys value -> why the attention reading it is not the pattern

    # constants the matcher asks about: Constant nodes and small initializers
    def _const(self, name: str) -> np.ndarray | None:
        n = self.index.producer.get(name)
        if n is not None and n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    return np.asarray(self.onnx.numpy_helper.to_array(a.t))
                if a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                    return np.asarray(self.helper.get_attribute_value(a))
            return None
        if name in self.f.inline:
            return np.asarray(self.f.inline[name])
        info = self.f.weights.get(name)
        if info is not None and info.nbytes <= 256:
            return np.asarray(self.f.value(name, 256))
        return None

    def _shape(self, vi: Any) -> list[int | str]:
        t = vi.type.tensor_type
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "") for d in t.shape.dim]

    # layers -------------------------------------------------------------------------------------------------
    def _layers(self) -> dict[int, dict[str, str]]:
        past: dict[int, dict[str, str]] = {}
        for name in self.inputs:
            m = PAST.match(name)
            if m:
                past.setdefault(int(m[1]), {})["past." + m[2]] = name
        if not past:
            raise NotMappable("the model has no past_key_values.N.key/value inputs (exported without a KV cache), "
                              "so every step would recompute the whole sequence; run it with Session.run")
        for name in self.outputs:
            m = PRESENT.match(name)
            if m and int(m[1]) in past:
                past[int(m[1])]["present." + m[2]] = name
        for i, io in sorted(past.items()):
            missing = {"past.key", "past.value", "present.key", "present.value"} - set(io)
            if missing:
                raise NotMappable(f"layer {i} lacks its {', '.join(sorted(missing))} cache I/O")
        return past

    def _check_io(self, layers: dict[int, dict[str, str]]) -> None:
        caches = {n for io in layers.values() for n in io.values()}
        if "input_ids" not in self.inputs:
            raise NotMappable("the model has no input_ids input (generation feeds token ids)")
        extra = sorted(set(self.inputs) - KNOWN_INPUTS - caches)
        if extra:
            raise NotMappable(f"input {extra[0]!r} has no counterpart in generation (the runtime feeds tokens, "
                              "positions and the cache)")
        if "logits" not in self.outputs:
            raise NotMappable("the model has no logits output")
        others = sorted(set(self.outputs) - {"logits"} - caches)
        if others:
            raise NotMappable(f"output {others[0]!r} has no counterpart in generation")
        ids = self._shape(self.inputs["input_ids"])
        if len(ids) != 2 or (isinstance(ids[0], int) and ids[0] > 1):
            raise NotMappable(f"input_ids must be [batch, seq] with a free or unit batch, found {ids}")

    def run(self) -> KVPlan:
        layers = self._layers()
        self._check_io(layers)
        regions = self._decomposed_regions(layers)
        planned: list[Layer] = []
        for i, io in sorted(layers.items()):
            planned.append(self._map_layer(i, io, regions.get(io["present.key"])))
        self._rewire_io(layers, planned)
        self._prune()
        opsets = {**self.f.opsets, KV_DOMAIN: 1}
        self.model.opset_import.append(self.helper.make_opsetid(KV_DOMAIN, 1))
        file = replace(self.f, model=self.model, opsets=opsets)
        return KVPlan(self.f, file, "", tuple(planned), self.context)

    def _decomposed_regions(self, layers: dict[int, dict[str, str]]) -> dict[str, Region]:
        """present.N.key -> the attention region that reads it (each Softmax matched once); why the others did not
        match is kept in ``failures`` (by the keys value they read, "" when the walk did not get that far: a layer
        without a region reports its own failure, else the first one)."""
        values = {io["present.key"]: io["present.value"] for io in layers.values()}
        found: dict[str, Region] = {}
        for sm in softmaxes(self.index):
            try:
                region = match_attention(self.index, sm)
            except NoMatch as exc:
                self.failures.setdefault(exc.root, str(exc))
                continue
            if values.get(region.k_root) == region.v_root:
                found[region.k_root] = region
        return found

    def _map_layer(self, i: int, io: dict[str, str], region: Region | None) -> Layer:
        past_vi = self.inputs[io["past.key"]]
        shape = self._shape(past_vi)
        if len(shape) != 4:
            raise NotMappable(f"past_key_values.{i}.key must be [batch, kv_heads, past, head], found {shape}")
        node = self.index.producer.get(io["present.key"])
        if node is not None and node.domain == MS_DOMAIN and node.op_type == "GroupQueryAttention":
            return self._map_gqa(i, io, node, shape)
        why = match_kv_concat(self.index, io["present.key"], io["past.key"]) or match_kv_concat(
            self.index, io["present.value"], io["past.value"])
        if why:
            raise NotMappable(f"layer {i}: present.{i}.key: {why}")
        if region is None:
            why = self.failures.get(io["present.key"]) or next(iter(self.failures.values()), "")
            raise NotMappable(f"layer {i}: no MatMul/Softmax attention reads present.{i}.key the way an exported "
                              f"attention does{f' ({why})' if why else ' (see uaii.loaders.onnx.kv_match)'}")
        kv, head, v_head = shape[1], shape[3], self._shape(self.inputs[io["past.value"]])[-1]
        if not all(isinstance(d, int) and d > 0 for d in (kv, head, v_head)):
            raise NotMappable(f"layer {i}: the cache must have static heads and head sizes, found {shape}")
        attrs = {"scale": float(region.scale), "softcap": float(region.softcap)}
        self.new_nodes.append(self.helper.make_node(
            KV_ATTENTION, [region.q, region.k_new, region.v_new, f"past_k.{i}", f"past_v.{i}"],
            [region.out, f"present_k.{i}", f"present_v.{i}"], name=f"uaii.kv/attention.{i}", domain=KV_DOMAIN,
            **attrs))
        self.dead.add(id(self.index.producer[region.out]))  # the new node writes its output
        return Layer(i, "attention", int(kv), int(head), tuple(region.probes), int(v_head))

    def _map_gqa(self, i: int, io: dict[str, str], node: Any, shape: list[int | str]) -> Layer:
        ins = list(node.input) + [""] * max(0, 10 - len(node.input))
        if through_identity(self.index, ins[3]) != io["past.key"] or through_identity(self.index, ins[4]) != \
                io["past.value"] or list(node.output[1:3]) != [io["present.key"], io["present.value"]]:
            raise NotMappable(f"layer {i}: GroupQueryAttention {node.name!r} does not read past_key_values.{i} and "
                              f"write present.{i} directly")
        kv = int(attr(node, "kv_num_heads", 0))
        head = shape[3] if isinstance(shape[3], int) else self._gqa_head(node)
        if shape[1] != kv or head <= 0:
            raise NotMappable(f"layer {i}: cannot tell the cache's head size (past {shape}, kv_num_heads {kv})")
        if len(ins) > 10 and ins[10]:
            raise NotMappable(f"layer {i}: GroupQueryAttention {node.name!r} takes an attention_bias; the cached "
                              "layer attends causally without one")
        if len(ins) > 8 and ins[7]:
            rows = self.f.shapes.get(ins[7], ())
            self.context = max(self.context, int(rows[0]) if rows else 0)
        # what onnxruntime reads the past length and the rotary positions from; generation replaces them, so they
        # must be those of one unpadded sequence (checked after import)
        probes = tuple(Probe(ins[slot], kind) for slot, kind in ((5, "seqlens"), (6, "total"),
                                                                  (POSITIONS_SLOT, "positions")) if ins[slot])
        ins[3], ins[4], ins[5], ins[6], ins[POSITIONS_SLOT] = f"past_k.{i}", f"past_v.{i}", "", "", POSITIONS
        outs = [node.output[0], f"present_k.{i}", f"present_v.{i}", *node.output[3:]]
        self.new_nodes.append(self.helper.make_node(KV_GQA, ins, outs, name=f"uaii.kv/gqa.{i}", domain=KV_DOMAIN))
        self.new_nodes[-1].attribute.extend(node.attribute)
        self.dead.add(id(node))
        return Layer(i, "gqa", kv, int(head), probes)

    def _gqa_head(self, node: Any) -> int:
        """Head size of a GroupQueryAttention whose cache declares it symbolically: from the query's width."""
        heads, kv = int(attr(node, "num_heads", 0)), int(attr(node, "kv_num_heads", 0))
        width = self._width(node.input[0])
        packed = len(node.input) < 2 or not node.input[1]
        parts = heads + 2 * kv if packed else heads
        return width // parts if width and parts and width % parts == 0 else 0

    def _width(self, name: str) -> int:
        """The last dim of a value that a (quantized) projection computes, where its weight tells it."""
        for _ in range(4):
            n = self.index.producer.get(name)
            if n is None:
                return 0
            if n.op_type == "MatMulNBits":
                return int(attr(n, "N", 0))
            if n.op_type in ("MatMul", "Gemm"):
                w = self.f.shapes.get(n.input[1])
                transposed = n.op_type == "Gemm" and int(attr(n, "transB", 0))
                return int(w[0 if transposed else -1]) if w else 0
            if n.op_type != "Add":
                return 0
            name = n.input[0]
        return 0

    # I/O and cleanup ----------------------------------------------------------------------------------------
    def _const_node(self, name: str, array: np.ndarray) -> str:
        self.new_nodes.append(self.helper.make_node("Constant", [], [name], name=name,
                                                    value=self.onnx.numpy_helper.from_array(array, name)))
        return name

    def _node(self, op: str, ins: list[str], out: str, **attrs: Any) -> None:
        self.new_nodes.append(self.helper.make_node(op, ins, [out], name=out, **attrs))

    def _rewire_io(self, layers: dict[int, dict[str, str]], planned: list[Layer]) -> None:
        TP = self.onnx.TensorProto
        ids = self.inputs["input_ids"]
        seq = self._shape(ids)[1] or "sequence_length"
        axes = self._const_node("uaii.kv/axes0", np.asarray([0], np.int64))
        new_inputs = [self.helper.make_tensor_value_info(TOKENS, TP.INT64, [seq]),
                      self.helper.make_tensor_value_info(POSITIONS, TP.INT64, [seq])]
        self._bridge_ids("input_ids", TOKENS, axes)
        if "position_ids" in self.inputs:
            self._bridge_ids("position_ids", POSITIONS, axes)
        for la in planned:
            io = layers[la.index]
            for kind, cache in (("key", "k"), ("value", "v")):
                vi = self.inputs[io[f"past.{kind}"]]
                past_dim = self._shape(vi)[2] or "past_sequence_length"
                name = f"past_{cache}.{la.index}"
                head = la.v_head_dim if kind == "value" and la.v_head_dim else la.head_dim
                new_inputs.append(self.helper.make_tensor_value_info(
                    name, vi.type.tensor_type.elem_type, [past_dim, la.kv_heads, head]))
                self._node("Unsqueeze", [name, axes], f"{name}/batched")
                self._node("Transpose", [f"{name}/batched"], io[f"past.{kind}"], perm=[0, 2, 1, 3])
                if self.index.producer.get(io[f"present.{kind}"]) is None or id(
                        self.index.producer[io[f"present.{kind}"]]) in self.dead:  # GQA wrote it: rebuild it
                    self._node("Unsqueeze", [f"present_{cache}.{la.index}", axes], f"present_{cache}.{la.index}/b")
                    self._node("Transpose", [f"present_{cache}.{la.index}/b"], io[f"present.{kind}"],
                               perm=[0, 2, 1, 3])
        if "attention_mask" in self.inputs:
            self._ones_mask(planned[0].index, axes)
        self._squeeze_logits(axes, seq)
        names = ["logits", *(f"present_{c}.{la.index}" for la in planned for c in "kv")]
        names += [p.value for la in planned for p in la.probes]  # layers may share one mask
        outputs = [self.helper.make_empty_tensor_value_info(n) for n in dict.fromkeys(names)]
        del self.g.input[:]
        self.g.input.extend(new_inputs)
        del self.g.output[:]
        self.g.output.extend(outputs)

    def _bridge_ids(self, old: str, new: str, axes: str) -> None:
        """``old`` [1, seq] from the 1-D graph input ``new`` (cast back when the model took int32)."""
        elem = self.inputs[old].type.tensor_type.elem_type
        TP = self.onnx.TensorProto
        if elem == TP.INT64:
            self._node("Unsqueeze", [new, axes], old)
            return
        self._node("Unsqueeze", [new, axes], f"{old}/i64")
        self._node("Cast", [f"{old}/i64"], old, to=elem)

    def _ones_mask(self, layer: int, axes: str) -> None:
        """attention_mask = ones [1, past + seq] (generation never pads)."""
        elem = self.inputs["attention_mask"].type.tensor_type.elem_type
        one = np.ones(1, dtype=self.helper.tensor_dtype_to_np_dtype(elem))
        self._node("Shape", [f"past_k.{layer}"], "uaii.kv/past_shape")
        self._node("Gather", ["uaii.kv/past_shape", axes], "uaii.kv/past_len", axis=0)
        self._node("Shape", [TOKENS], "uaii.kv/seq_len")
        self._node("Add", ["uaii.kv/past_len", "uaii.kv/seq_len"], "uaii.kv/total_len")
        self._const_node("uaii.kv/one", np.asarray([1], np.int64))
        self._node("Concat", ["uaii.kv/one", "uaii.kv/total_len"], "uaii.kv/mask_shape", axis=0)
        self.new_nodes.append(self.helper.make_node(
            "ConstantOfShape", ["uaii.kv/mask_shape"], ["attention_mask"], name="uaii.kv/attention_mask",
            value=self.onnx.numpy_helper.from_array(one)))

    def _squeeze_logits(self, axes: str, seq: int | str) -> None:
        """``logits`` [seq, vocab]: the lm_head's input squeezed when a MatMul computes the logits (so the head is
        a MatMul of [seq, d] rows, which the runtime narrows to the last row for generation), else the model's
        [1, seq, vocab] renamed and squeezed."""
        head = self.index.producer.get("logits")
        if head is not None and head.op_type in ("MatMul", "MatMulNBits") and head.input[0] not in self.inputs \
                and head.input[0] not in self.f.weights and head.input[0] not in self.f.inline:
            rows = f"{head.input[0]}/uaii.kv.rows"
            self._node("Squeeze", [head.input[0], axes], rows)
            head.input[0] = rows
            return
        batched = "logits/uaii.kv.batched"
        for n in self.g.node:
            n.output[:] = [batched if o == "logits" else o for o in n.output]
            n.input[:] = [batched if i == "logits" else i for i in n.input]
        self._node("Squeeze", [batched, axes], "logits")

    def _prune(self) -> None:
        """Keep the nodes the new outputs need (in order: old nodes, then the new ones where first needed)."""
        keep_nodes = [n for n in self.g.node if id(n) not in self.dead] + self.new_nodes
        needed = needed_nodes([(n.input, n.output) for n in keep_nodes], [o.name for o in self.g.output])
        order = _topological([keep_nodes[k] for k in needed])
        del self.g.node[:]
        self.g.node.extend(order)
        used = {i for n in order for i in n.input}
        for vi in list(self.g.input):
            if vi.name not in used and vi.name not in (TOKENS, POSITIONS) and not vi.name.startswith("past_"):
                self.g.input.remove(vi)


def _topological(nodes: list[Any]) -> list[Any]:
    """ONNX needs producers before consumers; the new nodes were appended at the end. Depth first, in file order:
    each new node lands just before its first consumer, the exporter's order is otherwise kept (the importer's
    symbolic shape folding sees the sources of the dims in the order the exporter wrote them). A cycle is refused."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    state = [0] * len(nodes)  # 0 unvisited, 1 on the current path, 2 placed
    out: list[Any] = []
    for root in range(len(nodes)):
        stack = [(root, False)]
        while stack:
            j, expanded = stack.pop()
            if state[j] == 2 or (state[j] == 1 and not expanded):
                if state[j] == 1:
                    raise NotMappable("the graph's nodes form a cycle")
                continue
            if expanded:
                state[j] = 2
                out.append(nodes[j])
                continue
            state[j] = 1
            stack.append((j, True))
            stack += [(producer[i], False) for i in nodes[j].input if i in producer and state[producer[i]] != 2]
    return out


__all__ = ["POSITIONS", "TOKENS", "KVPlan", "Layer", "NotMappable", "prepare_kv"]
