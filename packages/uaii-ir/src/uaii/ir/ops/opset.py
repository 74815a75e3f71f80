"""The built-in op names: one enum grouped by kind, and named sets over it.

``Op`` is a ``StrEnum``: ``Op.MATMUL == "MatMul"``, so the sets work on the plain strings held in
``Node.op`` (``node.op in ELEMENTWISE``). Plugin ops are plain strings and belong to no set; what a pass needs
to know about any op it reads from the op's schema (``schema.elementwise``, ``schema.cost``, ...). A test
checks that every member has a schema whose kind matches the set it is listed in.
"""

from __future__ import annotations

import enum


class Op(enum.StrEnum):
    # unary elementwise
    NEG = "Neg"
    RELU = "Relu"
    SILU = "Silu"
    GELU = "Gelu"
    SIGMOID = "Sigmoid"
    TANH = "Tanh"
    EXP = "Exp"
    SQRT = "Sqrt"
    SOFTCAP = "Softcap"
    CAST = "Cast"
    ERF = "Erf"
    RECIPROCAL = "Reciprocal"
    COS = "Cos"
    SIN = "Sin"
    ABS = "Abs"
    LOG = "Log"
    NOT = "Not"
    # binary elementwise (numpy broadcasting)
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    POW = "Pow"
    MAX = "Max"
    MIN = "Min"
    MOD = "Mod"
    # comparisons (-> bool) and logic, NumPy broadcasting
    EQUAL = "Equal"
    LESS = "Less"
    GREATER = "Greater"
    LESS_OR_EQUAL = "LessOrEqual"
    GREATER_OR_EQUAL = "GreaterOrEqual"
    AND = "And"
    OR = "Or"
    XOR = "Xor"
    # gated linear units
    SWIGLU = "SwiGLU"
    GEGLU = "GeGLU"
    # linear algebra
    MATMUL = "MatMul"
    MATMUL_RELU = "MatMulRelu"
    GEMM = "Gemm"
    MATMUL_NBITS = "MatMulNBits"
    QUANTIZED_MATMUL = "QuantizedMatMul"
    # normalization
    SOFTMAX = "Softmax"
    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"
    # reductions
    TOPK = "TopK"
    ARGMAX = "ArgMax"
    REDUCE_MEAN = "ReduceMean"
    REDUCE_SUM = "ReduceSum"
    REDUCE_MAX = "ReduceMax"
    REDUCE_MIN = "ReduceMin"
    CUMSUM = "CumSum"
    # movement (shape and layout)
    IDENTITY = "Identity"
    RESHAPE = "Reshape"
    TRANSPOSE = "Transpose"
    CONCAT = "Concat"
    SPLIT = "Split"
    SLICE = "Slice"
    # selection by a condition or by position
    WHERE = "Where"
    TRILU = "Trilu"
    # shapes computed from values (data-dependent output shapes)
    SHAPE = "Shape"
    RANGE = "Range"
    FILL = "Fill"
    EXPAND = "Expand"
    # indexing
    EMBEDDING = "Embedding"
    GATHER = "Gather"
    QUANTIZED_EMBEDDING = "QuantizedEmbedding"
    # attention
    ROPE = "RoPE"
    ATTENTION = "Attention"
    # mixture of experts
    MOE_ROUTER = "MoERouter"
    MOE_EXPERTS = "MoEExperts"
    MOE_EXPERTS_SWIGLU = "MoEExpertsSwiGLU"
    QUANTIZED_MOE_EXPERTS = "QuantizedMoEExperts"


UNARY = frozenset({
    Op.NEG, Op.RELU, Op.SILU, Op.GELU, Op.SIGMOID, Op.TANH, Op.EXP, Op.SQRT, Op.SOFTCAP, Op.CAST,
    Op.ERF, Op.RECIPROCAL, Op.COS, Op.SIN, Op.ABS, Op.LOG, Op.NOT,
})
BINARY = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN, Op.MOD,
    Op.EQUAL, Op.LESS, Op.GREATER, Op.LESS_OR_EQUAL, Op.GREATER_OR_EQUAL, Op.AND, Op.OR, Op.XOR,
})
COMPARE = frozenset({Op.EQUAL, Op.LESS, Op.GREATER, Op.LESS_OR_EQUAL, Op.GREATER_OR_EQUAL})
"""Binary ops whose result is bool."""
SELECT = frozenset({Op.WHERE, Op.TRILU})
ELEMENTWISE = UNARY | BINARY | frozenset({Op.WHERE})
GLU = frozenset({Op.SWIGLU, Op.GEGLU})
LINALG = frozenset({Op.MATMUL, Op.MATMUL_RELU, Op.GEMM, Op.MATMUL_NBITS, Op.QUANTIZED_MATMUL})
NORM = frozenset({Op.SOFTMAX, Op.LAYER_NORM, Op.RMS_NORM})
REDUCE = frozenset({Op.TOPK, Op.ARGMAX, Op.REDUCE_MEAN, Op.REDUCE_SUM, Op.REDUCE_MAX, Op.REDUCE_MIN, Op.CUMSUM})
MOVEMENT = frozenset({Op.IDENTITY, Op.RESHAPE, Op.TRANSPOSE, Op.CONCAT, Op.SPLIT, Op.SLICE})
INDEX = frozenset({Op.EMBEDDING, Op.GATHER, Op.QUANTIZED_EMBEDDING})
SHAPE = frozenset({Op.SHAPE, Op.RANGE, Op.FILL, Op.EXPAND})
"""Ops whose output shape follows from input *values* (or, for Shape, whose values follow from an input's shape)."""
ATTENTION = frozenset({Op.ROPE, Op.ATTENTION})
MOE = frozenset({Op.MOE_ROUTER, Op.MOE_EXPERTS, Op.MOE_EXPERTS_SWIGLU, Op.QUANTIZED_MOE_EXPERTS})

CPP_RUNTIME_OPS = frozenset({
    Op.MATMUL, Op.MATMUL_RELU, Op.ADD, Op.MUL, Op.RELU, Op.SILU, Op.GELU, Op.SOFTMAX, Op.LAYER_NORM,
    Op.RMS_NORM, Op.RESHAPE, Op.TRANSPOSE, Op.CONCAT, Op.SPLIT, Op.CAST, Op.IDENTITY, Op.ATTENTION, Op.ROPE,
    Op.EMBEDDING,
    Op.MOE_ROUTER, Op.MOE_EXPERTS, Op.MOE_EXPERTS_SWIGLU,
})
"""Names the existing C++ runtime writes into its IR files; each must resolve at version 1."""

GROUPS: dict[str, frozenset[Op]] = {
    "unary": UNARY, "binary": BINARY, "glu": GLU, "linalg": LINALG, "norm": NORM, "reduce": REDUCE,
    "movement": MOVEMENT, "index": INDEX, "attention": ATTENTION, "moe": MOE, "select": SELECT, "shape": SHAPE,
}
"""Kind name (``OpKind.value``) → the set of ops of that kind."""
assert frozenset().union(*GROUPS.values()) == frozenset(Op), "every Op belongs to exactly one group"
assert sum(len(g) for g in GROUPS.values()) == len(Op), "every Op belongs to exactly one group"

__all__ = ["ATTENTION", "BINARY", "COMPARE", "CPP_RUNTIME_OPS", "ELEMENTWISE", "GLU", "GROUPS", "INDEX", "LINALG",
           "MOE", "MOVEMENT", "NORM", "REDUCE", "SELECT", "SHAPE", "UNARY", "Op"]
