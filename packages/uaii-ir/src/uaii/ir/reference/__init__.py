"""The NumPy reference evaluator of UAII IR: the ground truth every backend, pass and loader is tested against.

One short function per op (modules mirror :mod:`uaii.ir.ops`), computed in float64 and rounded once to the
activation dtype; :data:`REFERENCE_OPS` maps (op, version) to them, :func:`run_node` runs one node and
:func:`evaluate` a whole graph. Values are NumPy arrays in their :attr:`DType.numpy` type (bf16 as raw uint16
words); block-quantized weights are dequantized by the caller's weight callback, so uaii-ir holds no
dequantization code.
"""

from uaii.ir.reference._common import EvaluationError, bf16_to_f32, f32_to_bf16
from uaii.ir.reference.attention import rope_inv_freq, visible
from uaii.ir.reference.evaluator import WeightSource, evaluate, run_node
from uaii.ir.reference.table import REFERENCE_OPS, register_reference

__all__ = [
    "REFERENCE_OPS", "EvaluationError", "WeightSource", "bf16_to_f32", "evaluate", "f32_to_bf16",
    "register_reference", "rope_inv_freq", "run_node", "visible",
]
