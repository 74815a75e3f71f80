"""The hand-built half of the ONNX fixtures: one onnx.helper graph per op family the importer claims, MatMulNBits
alone (4/8 bits, block sizes 16..256, zero points, bias), and a model whose external data sits at unaligned offsets.

Each builder writes ``dest/model.onnx`` and returns the description ``scripts/onnx_fixtures.py`` turns into a
manifest entry (onnxruntime computes the reference outputs there). Every graph uses dim_params (``batch``, ``seq``)
for the dimensions a model leaves dynamic; the reference inputs have batch 1 and sequence 7.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

B, S = "batch", "seq"
BATCH, SEQ = 1, 7
F32_TOLERANCE = 1e-4
INT64_MAX = np.iinfo(np.int64).max
F32_MIN = float(np.finfo(np.float32).min)

Spec = tuple[str, int, list[int | str | None]]


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _init(name: str, value: Any, dtype: Any = np.float32) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _write(dest: Path, name: str, opset: int, nodes: list[Any], inputs: list[Spec], outputs: list[Spec],
           inits: list[Any], feeds: dict[str, np.ndarray], domains: dict[str, int] | None = None,
           **extra: Any) -> dict[str, Any]:
    """Save the graph (checked with strict shape inference) and describe the fixture."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(*s) for s in inputs],
                              [helper.make_tensor_value_info(*s) for s in outputs], inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="uaii-onnx-fixtures")
    model.ir_version = 10 if opset >= 21 else 8
    onnx.checker.check_model(model, full_check=not domains)
    onnx.save(model, str(dest / "model.onnx"))
    return {"file": "model.onnx", "kind": "forward", "exporter": "onnx-helper", "inputs": feeds, "expected": None,
            "tokenizer": False, **extra}


def _node(op: str, ins: list[str], outs: list[str], **attrs: Any) -> Any:
    from onnx import helper

    return helper.make_node(op, ins, outs, name=f"{op}_{outs[0]}", **attrs)


F, I64, BOOL, I32, F16 = 1, 7, 9, 6, 10  # TensorProto element types


# --- op families ---------------------------------------------------------------------------------------------------
def ops_elementwise(dest: Path) -> dict[str, Any]:
    rng = _rng("elementwise")
    x, y = _normal(rng, BATCH, SEQ, 8), _normal(rng, 8)
    p = (np.abs(_normal(rng, BATCH, SEQ, 8)) + 0.1).astype(np.float32)
    i = rng.integers(-20, 20, size=(BATCH, SEQ), dtype=np.int64)
    unary = ["Neg", "Abs", "Exp", "Erf", "Tanh", "Sigmoid", "Relu", "Cos", "Sin", "Floor", "Ceil"]
    positive = ["Sqrt", "Reciprocal", "Log"]
    nodes = [_node("Add", ["x", "y"], ["add"]), _node("Sub", ["x", "y"], ["sub"]), _node("Mul", ["x", "p"], ["mul"]),
             _node("Div", ["x", "p"], ["div"]), _node("Pow", ["p", "e"], ["pow"]), _node("Pow", ["x", "two"], ["sq"]),
             _node("Max", ["x", "y"], ["max"]), _node("Min", ["x", "y", "p"], ["min3"]),
             _node("Mod", ["i", "three"], ["mod3"]), _node("Mod", ["i", "minus4"], ["modm4"]),
             _node("Add", ["i", "three"], ["iadd"]), _node("Mul", ["i", "minus4"], ["imul"]),
             _node("Div", ["i", "three"], ["idiv"])]
    nodes += [_node(op, ["x"], [op.lower()]) for op in unary] + [_node(op, ["p"], [op.lower()]) for op in positive]
    outs = ["add", "sub", "mul", "div", "pow", "sq", "max", "min3"] + [o.lower() for o in unary + positive]
    outputs: list[Spec] = [(o, F, [B, S, 8]) for o in outs]
    outputs += [(o, I64, [B, S]) for o in ("mod3", "modm4", "iadd", "imul", "idiv")]
    inits = [_init("e", 1.5), _init("two", 2.0), _init("three", [3], np.int64), _init("minus4", [-4], np.int64)]
    return _write(dest, "elementwise", 18, nodes, [("x", F, [B, S, 8]), ("y", F, [8]), ("p", F, [B, S, 8]),
                                                   ("i", I64, [B, S])], outputs, inits,
                  {"x": x, "y": y, "p": p, "i": i})


def ops_compare(dest: Path) -> dict[str, Any]:
    rng = _rng("compare")
    x, y = _normal(rng, BATCH, SEQ, 8), _normal(rng, 8)
    i = rng.integers(0, 4, size=(BATCH, SEQ), dtype=np.int64)
    a, b = rng.random((BATCH, SEQ)) < 0.5, rng.random((BATCH, SEQ)) < 0.5
    c = rng.random((BATCH, SEQ, 1)) < 0.5
    n = _normal(rng, BATCH, SEQ, 8)
    n[0, 1, 2], n[0, 3, 4], n[0, 5, 6] = np.nan, np.inf, -np.inf
    nodes = [_node("Equal", ["i", "k"], ["eq"]), _node("Less", ["x", "y"], ["lt"]),
             _node("Greater", ["x", "y"], ["gt"]), _node("LessOrEqual", ["i", "k"], ["le"]),
             _node("GreaterOrEqual", ["x", "y"], ["ge"]), _node("Equal", ["x", "x"], ["feq"]),
             _node("And", ["a", "b"], ["and"]), _node("Or", ["a", "b"], ["or"]), _node("Xor", ["a", "b"], ["xor"]),
             _node("Not", ["a"], ["not"]), _node("Where", ["c", "x", "y"], ["where"]),
             _node("Where", ["c", "x", "fmin"], ["where_scalar"]), _node("IsNaN", ["n"], ["isnan"]),
             _node("IsInf", ["n"], ["isinf"]), _node("Where", ["isnan", "zero", "n"], ["nan_to_zero"])]
    outputs: list[Spec] = [("eq", BOOL, [B, S]), ("lt", BOOL, [B, S, 8]), ("gt", BOOL, [B, S, 8]),
                           ("le", BOOL, [B, S]), ("ge", BOOL, [B, S, 8]), ("feq", BOOL, [B, S, 8]),
                           ("and", BOOL, [B, S]), ("or", BOOL, [B, S]), ("xor", BOOL, [B, S]), ("not", BOOL, [B, S]),
                           ("where", F, [B, S, 8]), ("where_scalar", F, [B, S, 8]), ("isnan", BOOL, [B, S, 8]),
                           ("isinf", BOOL, [B, S, 8]), ("nan_to_zero", F, [B, S, 8])]
    inits = [_init("k", [2], np.int64), _init("fmin", F32_MIN), _init("zero", 0.0)]
    return _write(dest, "compare", 18, nodes, [("x", F, [B, S, 8]), ("y", F, [8]), ("i", I64, [B, S]),
                                               ("a", BOOL, [B, S]), ("b", BOOL, [B, S]), ("c", BOOL, [B, S, 1]),
                                               ("n", F, [B, S, 8])], outputs, inits,
                  {"x": x, "y": y, "i": i, "a": a, "b": b, "c": c, "n": n})


def ops_shape_fold(dest: Path) -> dict[str, Any]:
    """The legacy exporter's shape arithmetic: Shape -> Gather -> Unsqueeze -> Concat -> Reshape (opset 14)."""
    x = _normal(_rng("shape-fold"), BATCH, SEQ, 64)
    nodes = [_node("Shape", ["x"], ["shape"]), _node("Gather", ["shape", "i0"], ["b"], axis=0),
             _node("Gather", ["shape", "i1"], ["s"], axis=0), _node("Gather", ["shape", "i2"], ["h"], axis=0),
             _node("Unsqueeze", ["b", "ax0"], ["b1"]), _node("Unsqueeze", ["s", "ax0"], ["s1"]),
             _node("Div", ["h", "heads"], ["hd"]), _node("Unsqueeze", ["hd", "ax0"], ["hd1"]),
             _node("Concat", ["b1", "s1", "heads1", "hd1"], ["split_shape"], axis=0),
             _node("Reshape", ["x", "split_shape"], ["split"]),
             _node("Transpose", ["split"], ["heads_first"], perm=[0, 2, 1, 3]),
             _node("Transpose", ["heads_first"], ["back"], perm=[0, 2, 1, 3]),
             _node("Concat", ["b1", "s1", "minus1"], ["merge_shape"], axis=0),
             _node("Reshape", ["back", "merge_shape"], ["merged"]),
             _node("Reshape", ["x", "zero_zero_m1_8"], ["codes"]),
             _node("Mul", ["b", "s"], ["tokens"]), _node("Unsqueeze", ["tokens", "ax0"], ["tokens1"]),
             _node("Concat", ["tokens1", "minus1"], ["flat_shape"], axis=0),
             _node("Reshape", ["x", "flat_shape"], ["flat"]),
             _node("Cast", ["s"], ["s_f"], to=F), _node("Sqrt", ["s_f"], ["sqrt_s"]),
             _node("Div", ["x", "sqrt_s"], ["scaled"])]
    inits = [_init("i0", 0, np.int64), _init("i1", 1, np.int64), _init("i2", 2, np.int64),
             _init("ax0", [0], np.int64), _init("heads", 4, np.int64), _init("heads1", [4], np.int64),
             _init("minus1", [-1], np.int64), _init("zero_zero_m1_8", [0, 0, -1, 8], np.int64)]
    outputs: list[Spec] = [("heads_first", F, [B, 4, S, 16]), ("merged", F, [B, S, 64]), ("codes", F, [B, S, 8, 8]),
                           ("flat", F, [None, 64]), ("scaled", F, [B, S, 64])]
    return _write(dest, "shape_fold", 14, nodes, [("x", F, [B, S, 64])], outputs, inits, {"x": x})


def ops_shape_slice(dest: Path) -> dict[str, Any]:
    """Shape-15's start/end, Slice and Size on shapes, ConstantOfShape / Expand from a computed shape (opset 18)."""
    x = _normal(_rng("shape-slice"), BATCH, SEQ, 8)
    nodes = [_node("Shape", ["x"], ["tail"], start=1), _node("Shape", ["x"], ["mid"], start=1, end=-1),
             _node("Shape", ["x"], ["full"]), _node("Slice", ["full", "st0", "en2"], ["lead"]),
             _node("Size", ["x"], ["size"]), _node("Squeeze", ["mid", "ax0"], ["s"]),
             _node("ConstantOfShape", ["full"], ["ones"], value=_init("v", [1.0])),
             _node("Add", ["x", "ones"], ["x1"]),
             _node("Concat", ["lead", "one"], ["bcast_shape"], axis=0),
             _node("ReduceMean", ["x", "axm1"], ["mean"], keepdims=1),
             _node("Expand", ["mean", "full"], ["mean_full"]),
             _node("Expand", ["row", "bcast_shape"], ["row_b"]),
             _node("Cast", ["size"], ["size_f"], to=F), _node("Div", ["x", "size_f"], ["per_elem"]),
             _node("Range", ["zero", "s", "one_s"], ["positions"])]
    inits = [_init("st0", [0], np.int64), _init("en2", [2], np.int64), _init("ax0", [0], np.int64),
             _init("one", [1], np.int64), _init("axm1", [-1], np.int64), _init("row", [[0.5]]),
             _init("zero", 0, np.int64), _init("one_s", 1, np.int64)]
    outputs: list[Spec] = [("tail", I64, [2]), ("lead", I64, [2]), ("size", I64, []), ("x1", F, [B, S, 8]),
                           ("mean_full", F, [B, S, 8]), ("row_b", F, [B, S, 1]), ("per_elem", F, [B, S, 8]),
                           ("positions", I64, [None])]
    return _write(dest, "shape_slice", 18, nodes, [("x", F, [B, S, 8])], outputs, inits, {"x": x})


def ops_mask(dest: Path) -> dict[str, Any]:
    """Attention masks the exporters build: Range -> LessOrEqual causal mask, the padding mask, ConstantOfShape +
    Trilu, Where -> additive bias, Expand to the scores' shape, Softmax (opset 18)."""
    rng = _rng("mask")
    ids = rng.integers(0, 256, size=(BATCH, SEQ), dtype=np.int64)
    mask = np.asarray([[1, 1, 1, 1, 1, 0, 1]], dtype=np.int64)
    scores = _normal(rng, BATCH, 4, SEQ, SEQ)
    nodes = [_node("Shape", ["input_ids"], ["shape"]), _node("Gather", ["shape", "i1"], ["s"], axis=0),
             _node("Range", ["zero", "s", "one"], ["r"]), _node("Unsqueeze", ["r", "ax1"], ["rq"]),
             _node("Unsqueeze", ["r", "ax0"], ["rk"]), _node("LessOrEqual", ["rk", "rq"], ["causal"]),
             _node("Cast", ["attention_mask"], ["pad"], to=BOOL), _node("Unsqueeze", ["pad", "ax12"], ["pad4"]),
             _node("And", ["causal", "pad4"], ["allowed"]), _node("Where", ["allowed", "fzero", "fmin"], ["bias"]),
             _node("Shape", ["scores"], ["scores_shape"]), _node("Expand", ["bias", "scores_shape"], ["bias_full"]),
             _node("Add", ["scores", "bias_full"], ["masked"]), _node("Softmax", ["masked"], ["probs"], axis=-1),
             _node("Unsqueeze", ["s", "ax0"], ["s1"]), _node("Concat", ["s1", "s1"], ["ss"], axis=0),
             _node("ConstantOfShape", ["ss"], ["filled"], value=_init("v", [F32_MIN])),
             _node("Trilu", ["filled", "one"], ["upper"], upper=1), _node("Add", ["scores", "upper"], ["masked2"]),
             _node("Softmax", ["masked2"], ["probs2"], axis=-1)]
    inits = [_init("i1", 1, np.int64), _init("zero", 0, np.int64), _init("one", 1, np.int64),
             _init("ax0", [0], np.int64), _init("ax1", [1], np.int64), _init("ax12", [1, 2], np.int64),
             _init("fzero", 0.0), _init("fmin", F32_MIN)]
    outputs: list[Spec] = [("bias_full", F, [B, 4, S, S]), ("probs", F, [B, 4, S, S]), ("upper", F, [S, S]),
                           ("probs2", F, [B, 4, S, S])]
    return _write(dest, "mask", 18, nodes, [("input_ids", I64, [B, S]), ("attention_mask", I64, [B, S]),
                                            ("scores", F, [B, 4, S, S])], outputs, inits,
                  {"input_ids": ids, "attention_mask": mask, "scores": scores})


def ops_reduce(dest: Path) -> dict[str, Any]:
    rng = _rng("reduce")
    x, m = _normal(rng, BATCH, SEQ, 8), rng.integers(0, 2, size=(BATCH, SEQ), dtype=np.int64)
    nodes = [_node("ReduceSum", ["x", "axm1"], ["sum_last"], keepdims=1),
             _node("ReduceSum", ["x", "ax12"], ["sum_12"], keepdims=0), _node("ReduceSum", ["x"], ["sum_all"],
                                                                             keepdims=0),
             _node("ReduceMax", ["x", "ax1"], ["max_1"]), _node("ReduceMin", ["x", "axm1"], ["min_last"], keepdims=0),
             _node("ReduceMean", ["x", "axm1"], ["mean_last"]), _node("ReduceSum", ["m", "ax1"], ["mask_len"],
                                                                      keepdims=0)]
    inits = [_init("axm1", [-1], np.int64), _init("ax12", [1, 2], np.int64), _init("ax1", [1], np.int64)]
    outputs: list[Spec] = [("sum_last", F, [B, S, 1]), ("sum_12", F, [B]), ("sum_all", F, []), ("max_1", F, [B, 1, 8]),
                           ("min_last", F, [B, S]), ("mean_last", F, [B, S, 1]), ("mask_len", I64, [B])]
    return _write(dest, "reduce", 18, nodes, [("x", F, [B, S, 8]), ("m", I64, [B, S])], outputs, inits,
                  {"x": x, "m": m})


def ops_reduce_13(dest: Path) -> dict[str, Any]:
    """Opset 13: ReduceMean/Max/Min take ``axes`` as an attribute, ReduceSum as an input."""
    x = _normal(_rng("reduce-13"), BATCH, SEQ, 8)
    nodes = [_node("ReduceMean", ["x"], ["mean_last"], axes=[-1]), _node("ReduceMax", ["x"], ["max_1"], axes=[1],
                                                                           keepdims=0),
             _node("ReduceMin", ["x"], ["min_all"], keepdims=0), _node("ReduceSum", ["x", "ax2"], ["sum_2"])]
    outputs: list[Spec] = [("mean_last", F, [B, S, 1]), ("max_1", F, [B, 8]), ("min_all", F, []),
                           ("sum_2", F, [B, S, 1])]
    return _write(dest, "reduce_13", 13, nodes, [("x", F, [B, S, 8])], outputs, [_init("ax2", [2], np.int64)],
                  {"x": x})


def ops_norm(dest: Path) -> dict[str, Any]:
    rng = _rng("norm")
    x = _normal(rng, BATCH, SEQ, 8, scale=3.0)
    nodes = [_node("Softmax", ["x"], ["softmax_last"], axis=-1), _node("Softmax", ["x"], ["softmax_1"], axis=1),
             _node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
             _node("LayerNormalization", ["x", "gamma"], ["ln_nobias"], axis=-1, epsilon=1e-6)]
    inits = [_init("gamma", _normal(rng, 8) + 1.0), _init("beta", _normal(rng, 8, scale=0.1))]
    outputs: list[Spec] = [(o, F, [B, S, 8]) for o in ("softmax_last", "softmax_1", "ln", "ln_nobias")]
    return _write(dest, "norm", 18, nodes, [("x", F, [B, S, 8])], outputs, inits, {"x": x})


def ops_rmsnorm(dest: Path) -> dict[str, Any]:
    rng = _rng("rmsnorm")
    nodes = [_node("RMSNormalization", ["x", "scale"], ["rms"], axis=-1, epsilon=1e-6)]
    return _write(dest, "rmsnorm", 23, nodes, [("x", F, [B, S, 8])], [("rms", F, [B, S, 8])],
                  [_init("scale", _normal(rng, 8) + 1.0)], {"x": _normal(rng, BATCH, SEQ, 8, scale=2.0)})


def ops_gelu(dest: Path) -> dict[str, Any]:
    nodes = [_node("Gelu", ["x"], ["gelu"]), _node("Gelu", ["x"], ["gelu_tanh"], approximate="tanh")]
    return _write(dest, "gelu", 20, nodes, [("x", F, [B, S, 8])], [("gelu", F, [B, S, 8]), ("gelu_tanh", F, [B, S, 8])],
                  [], {"x": _normal(_rng("gelu"), BATCH, SEQ, 8, scale=2.0)})


def ops_tensor(dest: Path) -> dict[str, Any]:
    """Gather (an embedding table, a negative scalar index), GatherND (the dynamo exporter's padding mask), Slice
    (negative, stepped), Split (sizes and num_outputs), Concat, Transpose, Squeeze/Unsqueeze, Flatten, Identity,
    Dropout (inference)."""
    rng = _rng("tensor")
    x = _normal(rng, BATCH, SEQ, 8)
    ids = rng.integers(0, 32, size=(BATCH, SEQ), dtype=np.int64)
    pairs = np.stack([np.zeros((BATCH, SEQ), np.int64), rng.integers(0, SEQ, (BATCH, SEQ))], axis=-1)
    pick = rng.integers(0, SEQ, size=(BATCH, 2, 1), dtype=np.int64)
    nodes = [_node("Gather", ["table", "ids"], ["emb"], axis=0), _node("Gather", ["x", "last"], ["x_last"], axis=1),
             _node("GatherND", ["mask2d", "pairs"], ["gnd"]),
             _node("GatherND", ["x", "pick"], ["gnd_b1"], batch_dims=1),
             _node("Slice", ["x", "st1", "big", "ax1"], ["drop_first"]),
             _node("Slice", ["x", "stm1", "small", "ax2", "stepm2"], ["rev_stride"]),
             _node("Slice", ["x", "st_0_2", "en_m1_6", "ax_1_2"], ["window"]),
             _node("Split", ["x", "sizes"], ["part_a", "part_b"], axis=-1),
             _node("Split", ["x"], ["half_a", "half_b"], axis=2, num_outputs=2),
             _node("Concat", ["x", "emb"], ["cat"], axis=-1), _node("Transpose", ["x"], ["tr"], perm=[1, 0, 2]),
             _node("Unsqueeze", ["x", "ax_0_m1"], ["unsq"]), _node("Squeeze", ["unsq", "ax_0_m1"], ["sq"]),
             _node("Flatten", ["x"], ["flat"], axis=2), _node("Identity", ["x"], ["ident"]),
             _node("Dropout", ["x", "ratio"], ["drop"])]
    inits = [_init("table", _normal(rng, 32, 16)), _init("last", -1, np.int64), _init("st1", [1], np.int64),
             _init("big", [INT64_MAX], np.int64), _init("ax1", [1], np.int64), _init("stm1", [-1], np.int64),
             _init("small", [-INT64_MAX], np.int64), _init("ax2", [2], np.int64), _init("stepm2", [-2], np.int64),
             _init("st_0_2", [0, 2], np.int64), _init("en_m1_6", [-1, 6], np.int64), _init("ax_1_2", [1, 2], np.int64),
             _init("sizes", [3, 5], np.int64), _init("ax_0_m1", [0, -1], np.int64), _init("ratio", 0.25)]
    outputs: list[Spec] = [("emb", F, [B, S, 16]), ("x_last", F, [B, 8]), ("gnd", F, [B, S]), ("gnd_b1", F, [B, 2, 8]),
                           ("drop_first", F, [B, None, 8]), ("rev_stride", F, [B, S, 4]), ("window", F, [B, None, 4]),
                           ("part_a", F, [B, S, 3]), ("part_b", F, [B, S, 5]), ("half_a", F, [B, S, 4]),
                           ("half_b", F, [B, S, 4]), ("cat", F, [B, S, 24]), ("tr", F, [S, B, 8]),
                           ("sq", F, [B, S, 8]), ("flat", F, [None, 8]), ("ident", F, [B, S, 8]),
                           ("drop", F, [B, S, 8])]
    feeds = {"x": x, "ids": ids, "mask2d": _normal(rng, BATCH, SEQ), "pairs": pairs, "pick": pick}
    return _write(dest, "tensor", 18, nodes, [("x", F, [B, S, 8]), ("ids", I64, [B, S]), ("mask2d", F, [B, S]),
                                              ("pairs", I64, [B, S, 2]), ("pick", I64, [B, 2, 1])],
                  outputs, inits, feeds)


def ops_matmul(dest: Path) -> dict[str, Any]:
    rng = _rng("matmul")
    nodes = [_node("MatMul", ["x", "w"], ["xw"]), _node("MatMul", ["q", "k"], ["qk"]),
             _node("Gemm", ["a", "wt", "c"], ["gemm_tb"], transB=1, alpha=0.5, beta=2.0),
             _node("Gemm", ["at", "w"], ["gemm_ta"], transA=1)]
    inits = [_init("w", _normal(rng, 16, 32, scale=0.25)), _init("wt", _normal(rng, 32, 16, scale=0.25)),
             _init("c", _normal(rng, 32))]
    feeds = {"x": _normal(rng, BATCH, SEQ, 16), "q": _normal(rng, BATCH, 4, SEQ, 8),
             "k": _normal(rng, BATCH, 4, 8, SEQ), "a": _normal(rng, SEQ, 16), "at": _normal(rng, 16, SEQ)}
    inputs: list[Spec] = [("x", F, [B, S, 16]), ("q", F, [B, 4, S, 8]), ("k", F, [B, 4, 8, S]), ("a", F, [S, 16]),
                          ("at", F, [16, S])]
    outputs: list[Spec] = [("xw", F, [B, S, 32]), ("qk", F, [B, 4, S, S]), ("gemm_tb", F, [S, 32]),
                           ("gemm_ta", F, [S, 32])]
    return _write(dest, "matmul", 18, nodes, inputs, outputs, inits, feeds)


def ops_trilu_cumsum(dest: Path) -> dict[str, Any]:
    """Trilu (upper/lower, k) and CumSum (exclusive, reverse) — also position ids from an attention mask."""
    rng = _rng("trilu-cumsum")
    mask = np.asarray([[0, 0, 1, 1, 1, 1, 1]], dtype=np.int64)  # left padding
    nodes = [_node("Trilu", ["x"], ["upper"]), _node("Trilu", ["x", "km1"], ["lower_km1"], upper=0),
             _node("Trilu", ["x", "k1"], ["upper_k1"], upper=1), _node("CumSum", ["m", "ax1"], ["csum"]),
             _node("CumSum", ["m", "ax1"], ["csum_excl"], exclusive=1),
             _node("CumSum", ["m", "ax1"], ["csum_rev"], reverse=1),
             _node("CumSum", ["x", "axm1"], ["fsum_rev_excl"], exclusive=1, reverse=1),
             _node("Sub", ["csum", "k1"], ["pos"]), _node("Equal", ["m", "zero"], ["is_pad"]),
             _node("Where", ["is_pad", "k1", "pos"], ["position_ids"])]
    inits = [_init("km1", -1, np.int64), _init("k1", 1, np.int64), _init("ax1", 1, np.int64),
             _init("axm1", -1, np.int32), _init("zero", 0, np.int64)]
    outputs: list[Spec] = [("upper", F, [B, S, S]), ("lower_km1", F, [B, S, S]), ("upper_k1", F, [B, S, S]),
                           ("csum", I64, [B, S]), ("csum_excl", I64, [B, S]), ("csum_rev", I64, [B, S]),
                           ("fsum_rev_excl", F, [B, S, S]), ("position_ids", I64, [B, S])]
    return _write(dest, "trilu_cumsum", 14, nodes, [("x", F, [B, S, S]), ("m", I64, [B, S])], outputs, inits,
                  {"x": _normal(rng, BATCH, SEQ, SEQ), "m": mask})


def ops_cast(dest: Path) -> dict[str, Any]:
    rng = _rng("cast")
    x = (_normal(rng, BATCH, SEQ, 8) * 4).astype(np.float32)
    x[0, 0, :4] = [0.0, -0.0, 2.5, -2.5]
    i = rng.integers(-1000, 1000, size=(BATCH, SEQ), dtype=np.int64)
    nodes = [_node("Cast", ["x"], ["to_i64"], to=I64), _node("Cast", ["x"], ["to_i32"], to=I32),
             _node("Cast", ["x"], ["to_bool"], to=BOOL), _node("Cast", ["x"], ["to_f16"], to=F16),
             _node("Cast", ["to_f16"], ["f16_back"], to=F), _node("Cast", ["i"], ["i_to_f"], to=F),
             _node("Cast", ["to_bool"], ["bool_to_f"], to=F), _node("Cast", ["to_bool"], ["bool_to_i64"], to=I64),
             _node("CastLike", ["i", "x"], ["castlike"])]
    outputs: list[Spec] = [("to_i64", I64, [B, S, 8]), ("to_i32", I32, [B, S, 8]), ("to_bool", BOOL, [B, S, 8]),
                           ("f16_back", F, [B, S, 8]), ("i_to_f", F, [B, S]), ("bool_to_f", F, [B, S, 8]),
                           ("bool_to_i64", I64, [B, S, 8]), ("castlike", F, [B, S])]
    return _write(dest, "cast", 18, nodes, [("x", F, [B, S, 8]), ("i", I64, [B, S])], outputs, [], {"x": x, "i": i})


def ops_misc(dest: Path) -> dict[str, Any]:
    """Constant nodes (tensor / value_float / value_ints), ArgMax, TopK, Expand (bidirectional)."""
    from onnx import helper

    rng = _rng("misc")
    x = _normal(rng, BATCH, SEQ, 8)
    nodes = [helper.make_node("Constant", [], ["c_tensor"], value=_init("c", _normal(rng, 8))),
             helper.make_node("Constant", [], ["c_float"], value_float=0.5),
             helper.make_node("Constant", [], ["c_ints"], value_ints=[0, -1]),
             _node("Add", ["x", "c_tensor"], ["plus_c"]), _node("Mul", ["x", "c_float"], ["times_half"]),
             _node("Reshape", ["x", "c_ints"], ["reshaped"]),
             _node("ArgMax", ["x"], ["argmax"], axis=-1, keepdims=0), _node("ArgMax", ["x"], ["argmax_k"], axis=1),
             _node("TopK", ["x", "k3"], ["top_v", "top_i"], axis=-1),
             _node("Expand", ["col", "shape_s1"], ["expanded"])]
    inits = [_init("k3", [3], np.int64), _init("col", _normal(rng, 4, 1)), _init("shape_s1", [1, 5], np.int64)]
    outputs: list[Spec] = [("plus_c", F, [B, S, 8]), ("times_half", F, [B, S, 8]), ("reshaped", F, [B, None]),
                           ("argmax", I64, [B, S]), ("argmax_k", I64, [B, 1, 8]), ("top_v", F, [B, S, 3]),
                           ("top_i", I64, [B, S, 3]), ("expanded", F, [4, 5])]
    return _write(dest, "misc", 18, nodes, [("x", F, [B, S, 8])], outputs, inits, {"x": x})


# --- MatMulNBits ---------------------------------------------------------------------------------------------------
def quantize_nbits(w: np.ndarray, bits: int, block: int, zero_points: str | None) -> dict[str, np.ndarray]:
    """Block-quantize ``w`` [N, K] in com.microsoft MatMulNBits' layout.

    B: uint8 [N, k_blocks, block * bits / 8], 4-bit values low nibble first; K is zero-padded to whole blocks.
    scales: [N * k_blocks] f32. zero_points: None (the default 2^(bits-1): symmetric quantization), "uint8" (packed
    like B, each row padded to whole bytes: [N * ceil(k_blocks * bits / 8)]) or "float" ([N * k_blocks], the scales'
    type, not packed). Also returns ``dequant`` [N, K] float64: (q - zero_point) * scale, the spec's dequantization.
    """
    n, k = w.shape
    blocks = -(-k // block)
    qmax = (1 << bits) - 1
    wb = np.zeros((n, blocks * block), np.float64)
    wb[:, :k] = w
    wb = wb.reshape(n, blocks, block)
    if zero_points is None:
        half = 1 << (bits - 1)
        scale = np.maximum(np.abs(wb).max(-1), 1e-8) / (half - 1)
        zp = np.full((n, blocks), half, np.float64)
    else:
        lo, hi = np.minimum(wb.min(-1), 0.0), np.maximum(wb.max(-1), 0.0)
        scale = np.maximum(hi - lo, 1e-8) / qmax
        zp = np.clip(np.round(-lo / scale), 0, qmax)
    scale = scale.astype(np.float32).astype(np.float64)  # the stored f32 scales are what dequantization uses
    q = np.clip(np.round(wb / scale[..., None]) + zp[..., None], 0, qmax).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8) if bits == 4 else q
    out = {"B": packed, "scales": scale.astype(np.float32).reshape(-1)}
    if zero_points == "uint8":
        z = zp.astype(np.uint8)
        if bits == 4:
            z = np.concatenate([z, np.zeros((n, blocks % 2), np.uint8)], axis=1)
            z = (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
        out["zero_points"] = z.reshape(-1)
    elif zero_points == "float":
        zp = np.round(zp * 4) / 4 + 0.25  # a fractional zero point: what a float one can express and uint8 cannot
        out["zero_points"] = zp.astype(np.float32).reshape(-1)
    out["dequant"] = ((q.astype(np.float64) - zp[..., None]) * scale[..., None]).reshape(n, -1)[:, :k]
    return out


def _nbits_fixture(bits: int, block: int, zero_points: str | None, bias: bool,
                   accuracy_level: int) -> Callable[[Path], dict[str, Any]]:
    def build(dest: Path) -> dict[str, Any]:
        from onnx import helper

        rng = _rng(dest.name)
        k, n = 2 * block + block // 2, 24  # K not a multiple of the block: the last block is padded
        q = quantize_nbits(_normal(rng, n, k, scale=0.5), bits, block, zero_points)
        inits = [_init("B", q["B"], np.uint8), _init("scales", q["scales"])]
        ins = ["A", "B", "scales", "", "", ""]
        if zero_points:
            inits.append(_init("zero_points", q["zero_points"], q["zero_points"].dtype))
            ins[3] = "zero_points"
        bias_v = _normal(rng, n) if bias else np.zeros(n, np.float32)
        if bias:
            inits.append(_init("bias", bias_v))
            ins[5] = "bias"
        while ins[-1] == "":
            ins.pop()
        attrs: dict[str, Any] = {"K": k, "N": n, "bits": bits, "block_size": block}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        node = helper.make_node("MatMulNBits", ins, ["Y"], name="MatMulNBits_Y", domain="com.microsoft", **attrs)
        a = _normal(rng, BATCH, SEQ, k)
        expected = {"Y": (a.astype(np.float64) @ q["dequant"].T + bias_v).astype(np.float32)}
        built = _write(dest, dest.name, 21, [node], [("A", F, [B, S, k])], [("Y", F, [B, S, n])], inits, {"A": a},
                       domains={"com.microsoft": 1})
        built.update(expected=expected, expected_from="numpy float64 dequantize-then-matmul")
        if accuracy_level:
            built.update(expected=None, quantized=True)
        else:
            built["tolerance_note"] = ("accuracy_level 0: onnxruntime dequantizes to f32 and multiplies in f32; the "
                                       "generator checked it against float64 dequantize-then-matmul within 1e-4")
        return built
    return build


def _nbits_variants() -> dict[str, Callable[[Path], dict[str, Any]]]:
    out: dict[str, Callable[[Path], dict[str, Any]]] = {}

    def add(bits: int, block: int, zp: str | None = None, bias: bool = False, acc: int = 0) -> None:
        tag = {None: "", "uint8": "-zp", "float": "-zpf"}[zp] + ("-bias" if bias else "")
        tag += f"-acc{acc}" if acc else ""
        out[f"ops-matmulnbits-b{bits}-bs{block}{tag}"] = _nbits_fixture(bits, block, zp, bias, acc)

    for bits in (4, 8):
        for block in (16, 32, 64, 128, 256):
            add(bits, block)
            add(bits, block, "uint8", bias=True)
        add(bits, 32, "uint8")
        add(bits, 32, bias=True)
        add(bits, 32, acc=4)
    add(4, 32, "float")
    add(4, 128, "float", bias=True)
    return out


# --- external data at unaligned offsets ----------------------------------------------------------------------------
DATA_LOCATION = "data/weights.bin"


def build_external_unaligned(export: Callable[[Path], dict[str, Any]], dest: Path) -> dict[str, Any]:
    """llama-legacy's graph with every initializer of 32 bytes or more moved into one file, ``data/weights.bin``,
    each at an odd offset (onnx's own save aligns them; this one writes the offsets itself). Its outputs must equal
    the inline model's bit for bit."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    with tempfile.TemporaryDirectory(prefix="uaii-external-") as tmp:
        built = export(Path(tmp))
        inline_path = Path(tmp) / built["file"]
        model = onnx.load(str(inline_path))
        inline = ort.InferenceSession(str(inline_path), providers=["CPUExecutionProvider"])
        names = [o.name for o in inline.get_outputs()]
        inline_out = dict(zip(names, inline.run(names, built["inputs"]), strict=True))
    (dest / "data").mkdir()
    moved = 0
    with (dest / DATA_LOCATION).open("wb") as fh:
        fh.write(b"\x00")  # nothing starts at 0
        for tensor in model.graph.initializer:
            raw = numpy_helper.to_array(tensor).tobytes()
            if len(raw) < 32:
                continue
            if fh.tell() % 2 == 0:
                fh.write(b"\xa5")  # every offset odd: unaligned for every dtype
            offset = fh.tell()
            fh.write(raw)
            for field in ("raw_data", "float_data", "int64_data", "int32_data", "double_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", DATA_LOCATION), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            moved += 1
    (dest / "model.onnx").write_bytes(model.SerializeToString())
    session = ort.InferenceSession(str(dest / "model.onnx"), providers=["CPUExecutionProvider"])
    got = dict(zip(names, session.run(names, built["inputs"]), strict=True))
    for key, value in inline_out.items():
        if not np.array_equal(got[key], value):
            raise RuntimeError(f"external-unaligned: {key} differs from the inline model's")
    return {"file": "model.onnx", "kind": "forward", "exporter": "torch-legacy", "inputs": built["inputs"],
            "expected": inline_out, "expected_from": "the inline model", "tokenizer": False,
            "note": f"llama-legacy's graph; {moved} initializers in {DATA_LOCATION} at odd offsets"}


OPS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "ops-elementwise": ops_elementwise, "ops-compare": ops_compare, "ops-shape-fold": ops_shape_fold,
    "ops-shape-slice": ops_shape_slice, "ops-mask": ops_mask, "ops-reduce": ops_reduce,
    "ops-reduce-13": ops_reduce_13, "ops-norm": ops_norm, "ops-rmsnorm": ops_rmsnorm, "ops-gelu": ops_gelu,
    "ops-tensor": ops_tensor, "ops-matmul": ops_matmul, "ops-trilu-cumsum": ops_trilu_cumsum, "ops-cast": ops_cast,
    "ops-misc": ops_misc, **_nbits_variants()}
