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
    # binary elementwise (numpy broadcasting)
    ADD = "Add"
    SUB = "Sub"
    MUL = "Mul"
    DIV = "Div"
    # gated linear units
    SWIGLU = "SwiGLU"
    GEGLU = "GeGLU"
    # linear algebra
    MATMUL = "MatMul"
    MATMUL_RELU = "MatMulRelu"
    GEMM = "Gemm"
    # normalization
    SOFTMAX = "Softmax"
    LAYER_NORM = "LayerNorm"
    RMS_NORM = "RMSNorm"
    # reductions
    TOPK = "TopK"
    ARGMAX = "ArgMax"
    REDUCE_MEAN = "ReduceMean"
    # movement (shape and layout)
    IDENTITY = "Identity"
    RESHAPE = "Reshape"
    TRANSPOSE = "Transpose"
    CONCAT = "Concat"
    SPLIT = "Split"
    SLICE = "Slice"
    # indexing
    EMBEDDING = "Embedding"
    GATHER = "Gather"
    # attention
    ROPE = "RoPE"
    ATTENTION = "Attention"
    # mixture of experts
    MOE_ROUTER = "MoERouter"
    MOE_EXPERTS = "MoEExperts"
    MOE_EXPERTS_SWIGLU = "MoEExpertsSwiGLU"


UNARY = frozenset({
    Op.NEG, Op.RELU, Op.SILU, Op.GELU, Op.SIGMOID, Op.TANH, Op.EXP, Op.SQRT, Op.SOFTCAP, Op.CAST,
})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV})
ELEMENTWISE = UNARY | BINARY
GLU = frozenset({Op.SWIGLU, Op.GEGLU})
LINALG = frozenset({Op.MATMUL, Op.MATMUL_RELU, Op.GEMM})
NORM = frozenset({Op.SOFTMAX, Op.LAYER_NORM, Op.RMS_NORM})
REDUCE = frozenset({Op.TOPK, Op.ARGMAX, Op.REDUCE_MEAN})
MOVEMENT = frozenset({Op.IDENTITY, Op.RESHAPE, Op.TRANSPOSE, Op.CONCAT, Op.SPLIT, Op.SLICE})
INDEX = frozenset({Op.EMBEDDING, Op.GATHER})
ATTENTION = frozenset({Op.ROPE, Op.ATTENTION})
MOE = frozenset({Op.MOE_ROUTER, Op.MOE_EXPERTS, Op.MOE_EXPERTS_SWIGLU})

CPP_RUNTIME_OPS = frozenset({
    Op.MATMUL, Op.MATMUL_RELU, Op.ADD, Op.MUL, Op.RELU, Op.SILU, Op.GELU, Op.SOFTMAX, Op.LAYER_NORM,
    Op.RMS_NORM, Op.RESHAPE, Op.TRANSPOSE, Op.CONCAT, Op.SPLIT, Op.CAST, Op.IDENTITY, Op.ATTENTION, Op.ROPE,
    Op.EMBEDDING,
    Op.MOE_ROUTER, Op.MOE_EXPERTS, Op.MOE_EXPERTS_SWIGLU,
})
"""Names the existing C++ runtime writes into its IR files; each must resolve at version 1."""

GROUPS: dict[str, frozenset[Op]] = {
    "unary": UNARY, "binary": BINARY, "glu": GLU, "linalg": LINALG, "norm": NORM, "reduce": REDUCE,
    "movement": MOVEMENT, "index": INDEX, "attention": ATTENTION, "moe": MOE,
}
"""Kind name (``OpKind.value``) → the set of ops of that kind."""
assert frozenset().union(*GROUPS.values()) == frozenset(Op), "every Op belongs to exactly one group"
assert sum(len(g) for g in GROUPS.values()) == len(Op), "every Op belongs to exactly one group"

__all__ = ["ATTENTION", "BINARY", "CPP_RUNTIME_OPS", "ELEMENTWISE", "GLU", "GROUPS", "INDEX", "LINALG", "MOE",
           "MOVEMENT", "NORM", "REDUCE", "UNARY", "Op"]
