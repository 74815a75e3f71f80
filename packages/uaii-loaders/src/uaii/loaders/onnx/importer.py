"""ONNX graph -> UAII IR graph: check every node is translatable, then translate node by node.

The walk is in two passes. First every node is looked up in the dispatch table (and the model's opsets checked),
and everything unsupported is reported in one error — a user converting a model wants the whole list, not the
first miss. Then the nodes are translated in file order (ONNX requires topological order): graph inputs become IR
inputs (``dim_param`` -> IR symbols), initializers become weight references (never read) or, when small, folded
constants, and each node's handler builds IR through a :class:`~.context.NodeContext`. Graph outputs keep their
ONNX names. The result is validated by uaii.ir before anyone plans it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uaii.ir import Dim, DType, Graph, Node, Registry, Tensor, UaiiError, WeightRef
from uaii.ir.registry import default_registry

from ..index import TensorInfo
from . import dispatch
from .builder import GraphBuilder
from .context import NodeContext
from .dispatch import AI_ONNX, MIN_OPSET, OnnxImportError
from .onnx_api import elem_dtype, onnx_module
from .values import Value, sanitize_symbol

SMALL_CONST_BYTES = 64
"""Initializers up to this size are read and folded like constants (scalars, short shape vectors)."""
SMALL_INT_CONST_BYTES = 1 << 16
"""int64/int32/bool initializers up to this size are read too: shape data and index tables, not weights (8-bit
integers are left alone: they are quantized weights, MatMulNBits' packed blocks)."""


@dataclass(frozen=True)
class ImportedGraph:
    """The IR translation of an ONNX model's main graph."""

    graph: Graph
    weights: Mapping[str, TensorInfo]  # str(WeightRef) -> where its bytes are (the WeightIndex entries)
    symbols: Mapping[str, str]  # ONNX dim_param -> IR symbol
    notes: tuple[str, ...]


def max_opset() -> int:
    return int(onnx_module().defs.onnx_opset_version())


# --- pass 1: what is supported ------------------------------------------------------------------------------
def op_version(domain: str, op_type: str, opset: int) -> int | None:
    """The since-version of ``op_type`` at ``opset`` (ai.onnx from onnx.defs; other domains: the opset)."""
    if domain != AI_ONNX:
        return opset
    onnx = onnx_module()
    try:
        return int(onnx.defs.get_schema(op_type, opset, "").since_version)
    except Exception:  # onnx.defs.SchemaError: no such op at that opset
        return None


INTERNAL_DOMAINS = frozenset({"uaii.kv"})
"""Domains of the importer's own ops (the KV mapping's cached attention, :mod:`.contrib_attention`): only a graph
the mapping rewrote may hold them; in a model file they are refused like any unknown op (their handlers trust
what the mapping wrote)."""


def refuse_internal(model: Any, file_name: str) -> None:
    """A model file holding the importer's own ops (:data:`INTERNAL_DOMAINS`) is refused before anything else."""
    found = sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain in INTERNAL_DOMAINS})
    if found:
        raise OnnxImportError(f"{file_name}: cannot import: the graph uses {', '.join(found)}, UAII's internal "
                              "operators (only its KV-cache mapping writes them); they are not ONNX operators")


def check_supported(model: Any, opsets: Mapping[str, int], file_name: str, *,
                    internal: bool = False) -> dict[int, tuple[Any, int]]:
    """Handler and version for every node of the main graph; raises ONE error listing every problem.
    ``internal``: the graph is the KV mapping's rewrite, whose ``uaii.kv`` nodes are allowed."""
    dispatch.supported_ops()  # registers the handler modules
    top = max_opset()
    problems: list[str] = []
    base = opsets.get(AI_ONNX)
    if base is not None and not MIN_OPSET <= base <= top:
        problems.append(f"ai.onnx opset {base} is outside the supported range {MIN_OPSET}..{top}")
    missing: set[tuple[str, str, str]] = set()
    chosen: dict[int, tuple[Any, int]] = {}
    for i, node in enumerate(model.graph.node):
        domain = "" if node.domain == "ai.onnx" else node.domain
        if domain in INTERNAL_DOMAINS and not internal:
            missing.add((domain, node.op_type, "internal to UAII, not an ONNX operator"))
            continue
        opset = opsets.get(domain)
        if opset is None:
            missing.add((domain or "ai.onnx", node.op_type, "domain not imported by the model"))
            continue
        version = op_version(domain, node.op_type, opset)
        exact = domain == AI_ONNX
        if version is None and domain == AI_ONNX:  # an onnxruntime op in the default domain (onnx.defs lacks it)
            version, exact = opset, False
        reg = None if version is None else dispatch.resolve(domain, node.op_type, version, exact=exact)
        if reg is None or version is None:
            v = f"version {version}" if version is not None else f"unknown at opset {opset}"
            missing.add((domain or "ai.onnx", node.op_type, v))
            continue
        chosen[i] = (reg, version)
    if missing:
        listed = ", ".join(f"{d}::{op} ({v})" for d, op, v in sorted(missing))
        problems.append(f"{len(missing)} unsupported operator(s): {listed}")
    if problems:
        raise OnnxImportError(f"{file_name}: cannot import: " + "; ".join(problems))
    return chosen


# --- pass 2: translation ------------------------------------------------------------------------------------
class _Importer:
    def __init__(self, onnx_file: Any, registry: Registry, internal: bool = False) -> None:
        self.f = onnx_file
        self.internal = internal
        self.path = Path(onnx_file.path)
        self.file_name = self.path.name
        self.model = onnx_file.model
        self.graph = self.model.graph
        self.onnx = onnx_module()
        self.notes: list[str] = []
        self.values: dict[str, Value] = {}
        self.entries: dict[str, TensorInfo] = {}
        self.symbols: dict[str, str] = {}
        self.initializers = {t.name for t in self.graph.initializer}
        names = set(self.initializers) | {i.name for i in self.graph.input} | {o.name for o in self.graph.output}
        names |= {o for n in self.graph.node for o in n.output}
        self.b = GraphBuilder(self.file_name, registry, names)
        self.consumed = {x for n in self.graph.node for x in n.input if x} | {o.name for o in self.graph.output}
        self._const_cache: dict[str, np.ndarray | None] = {}

    # values ----------------------------------------------------------------------------------------------
    def lookup(self, name: str, where: str) -> Value:
        v = self.values.get(name)
        if v is not None:
            return v
        if name in self.initializers:
            v = self.values[name] = self.initializer(name, where)
            return v
        raise OnnxImportError(f"{where}: input {name!r} is not produced by an earlier node, a graph input or an "
                              "initializer (ONNX requires nodes in topological order)")

    def initializer(self, name: str, where: str) -> Value:
        code = self.f.onnx_types.get(name)
        onnx = self.onnx
        if code in (onnx.TensorProto.UINT16, onnx.TensorProto.UINT64):  # uint16 would read as bf16 words
            elem_dtype(code, f"{self.file_name}: initializer {name!r}")  # raises, naming the type
        if name in self.f.inline:  # typed fields or tiny: values already in memory
            return Value.of_array(_plain_array(self.f.value(name, 1 << 62), f"{self.file_name}: initializer "
                                                                             f"{name!r}"))
        info: TensorInfo | None = self.f.weights.get(name)
        if info is None:
            raise OnnxImportError(f"{where}: initializer {name!r} has no data the reader could locate")
        small = info.nbytes <= SMALL_CONST_BYTES or (
            info.dtype in (DType.I64, DType.I32, DType.BOOL)
            and info.nbytes <= SMALL_INT_CONST_BYTES)
        if small:
            return Value.of_array(_plain_array(self.f.value(name, SMALL_INT_CONST_BYTES),
                                               f"{self.file_name}: initializer {name!r}"))
        ref = WeightRef(self.path.name, name)
        self.entries[str(ref)] = info
        return self.b.weight(name, info.dtype, tuple(int(d) for d in info.shape), ref)

    def read_initializer(self, name: str, limit: int) -> np.ndarray | None:
        info = self.f.weights.get(name)
        if info is None or info.nbytes > limit:
            return None
        if name not in self._const_cache:
            self._const_cache[name] = _plain_array(self.f.value(name, limit), f"{self.file_name}: initializer "
                                                                                f"{name!r}")
        return self._const_cache[name]

    # graph inputs ----------------------------------------------------------------------------------------
    def symbol(self, dim_param: str) -> str:
        sym = self.symbols.get(dim_param)
        if sym is None:
            sym = base = sanitize_symbol(dim_param)
            n = 1
            while sym in self.symbols.values():
                n += 1
                sym = f"{base}v{n}"  # (no "_<n>" ending: that is the form of generated symbols)
            self.symbols[dim_param] = sym
        return sym

    def graph_inputs(self) -> list[str]:
        out: list[str] = []
        for vi in self.graph.input:
            if vi.name in self.initializers:
                continue  # an initializer listed as input (IR < 4 style default value): a constant here
            where = f"{self.file_name}: graph input {vi.name!r}"
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None or not tt.HasField("elem_type"):
                raise OnnxImportError(f"{where}: only tensor inputs are supported")
            dtype = elem_dtype(tt.elem_type, where)
            shape: list[Dim] = []
            if not tt.HasField("shape"):
                raise OnnxImportError(f"{where}: the input has no shape (not even a rank); the IR needs its rank")
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value >= 0:
                    shape.append(int(d.dim_value))
                elif d.HasField("dim_param") and d.dim_param:
                    shape.append(self.symbol(d.dim_param))
                else:
                    shape.append(self.b.fresh_symbol(f"{sanitize_symbol(vi.name)}_dim{k}"))
            self.values[vi.name] = self.b.graph_input(vi.name, dtype, tuple(shape))
            out.append(vi.name)
        return out

    # nodes -----------------------------------------------------------------------------------------------
    def translate(self, i: int, node: Any, reg: Any, version: int) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        ctx_where = f"{self.file_name}: node {node.name or node.op_type + '#' + str(i)!r}"
        inputs = [None if not x else self.lookup(x, ctx_where) for x in node.input]
        ctx = NodeContext(node, i, self.f.opsets.get(domain, 0), reg.since, inputs, self.b, self.read_initializer,
                          self.consumed.__contains__, self.notes, self.file_name)
        self.b.node_start = len(self.b.nodes)
        self.b.hint = next((o for o in node.output if o), node.op_type)
        try:
            result = reg.handler(ctx)
        except UaiiError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as exc:
            raise OnnxImportError(f"{ctx.where}: cannot translate: {type(exc).__name__}: {exc}") from exc
        outs = [result] if isinstance(result, Value) else list(result)
        if len(outs) > len(node.output):
            ctx.fail(f"internal error: the handler returned {len(outs)} values for {len(node.output)} outputs")
        for k, name in enumerate(node.output):
            v = outs[k] if k < len(outs) else None
            if not name:
                continue
            if v is None:
                if name in self.consumed:
                    ctx.fail(f"output #{k} ({name!r}) is used but not supported by the importer")
                continue
            self.values[name] = self.b.adopt(v, name) if v.name else v

    # outputs ---------------------------------------------------------------------------------------------
    def graph_outputs(self) -> tuple[list[str], dict[str, str]]:
        """Output names (the ONNX ones) and the IR renames that give produced values those names."""
        producers = {o for n in self.b.nodes for o in n.outputs}
        names = {vo.name for vo in self.graph.output}
        renames: dict[str, str] = {}
        out: list[str] = []
        for vo in self.graph.output:
            where = f"{self.file_name}: graph output {vo.name!r}"
            v = self.lookup(vo.name, where)
            if v.name == vo.name and v.name in producers:
                pass
            elif v.name and v.name in producers and v.name not in renames and v.name not in names and \
                    v.transposed is None:  # (a value that is another output under its own name is copied)
                renames[v.name] = vo.name
            else:
                src = self.b.place(v, where)
                self.b.nodes.append(Node(f"output_{len(out)}", "Identity", (src,), (vo.name,)))
                self.b.declare(Tensor(vo.name, v.dtype, v.shape))
            out.append(vo.name)
        return out, renames

    def run(self, name: str | None) -> ImportedGraph:
        chosen = check_supported(self.model, self.f.opsets, self.file_name, internal=self.internal)
        inputs = self.graph_inputs()
        for i, node in enumerate(self.graph.node):
            reg, version = chosen[i]
            self.translate(i, node, reg, version)
        outputs, renames = self.graph_outputs()
        if renames:
            _rename(self.b, renames)
        meta = {"source.format": "onnx", "onnx.opset": str(self.f.opsets.get(AI_ONNX, 0)),
                "onnx.producer": f"{self.model.producer_name} {self.model.producer_version}".strip()}
        graph = self.b.build(name or self.graph.name or self.path.stem, inputs, outputs, meta)
        return ImportedGraph(graph, dict(self.entries), dict(self.symbols), tuple(self.notes))


def _rename(b: GraphBuilder, renames: Mapping[str, str]) -> None:
    def r(x: str) -> str:
        return renames.get(x, x)

    b.nodes = [Node(n.name, n.op, tuple(r(x) for x in n.inputs), tuple(r(x) for x in n.outputs), n.attributes,
                    n.version) for n in b.nodes]
    b.tensors = {r(k): (Tensor(r(t.name), t.dtype, t.shape, t.weight, t.data, t.storage_hint, t.is_weight)
                        if k in renames else t) for k, t in b.tensors.items()}


def _plain_array(arr: np.ndarray, where: str) -> np.ndarray:
    a = np.asarray(arr)
    if a.dtype.name == "bfloat16":
        return a.view(np.uint16)
    try:
        DType.from_numpy(a.dtype)
    except UaiiError:
        raise OnnxImportError(f"{where}: element type {a.dtype} is not supported") from None
    return a


def import_graph(onnx_file: Any, *, name: str | None = None, registry: Registry | None = None,
                 internal: bool = False) -> ImportedGraph:
    """Translate ``onnx_file`` (an :class:`~.reader.OnnxFile`) to IR. Not validated here: the caller checks the
    final graph (after the KV mapping, which may rewrite it). ``internal``: ``onnx_file`` is the KV mapping's
    rewrite (:func:`.kv.prepare_kv`), the one graph whose ``uaii.kv`` nodes are accepted; a model file's are
    refused."""
    return _Importer(onnx_file, registry or default_registry(), internal).run(name)


__all__ = ["INTERNAL_DOMAINS", "SMALL_CONST_BYTES", "ImportedGraph", "check_supported", "import_graph", "max_opset",
           "op_version", "refuse_internal"]
