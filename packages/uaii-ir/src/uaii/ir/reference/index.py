"""Indexing references: Embedding (row lookup) and Gather (ONNX Gather). Both keep the table's dtype."""

from __future__ import annotations

import numpy as np

from uaii.ir.reference._common import Array, RefFn, check_index, fail


def embedding(indices: Array, table: Array) -> Array:
    """Y[..., :] = table[indices[...], :].

    Indices may be float32 holding whole numbers (the C++ runtime's token input); anything else, or an id
    outside [0, vocab), is an error (negative ids are not wrapped: a token id is never relative). A
    block-quantized table arrives dequantized (float32); the evaluator rounds Y to the declared output type.
    """
    if table.ndim != 2:
        fail("Embedding", f"table must be [vocab, dim], found {list(table.shape)}")
    if np.any(np.asarray(indices) < 0):
        fail("Embedding", f"negative token id {int(np.min(indices))}")
    ids = check_index("Embedding", indices, table.shape[0], "token ids")
    return table[ids]


def gather(data: Array, indices: Array, *, axis: int = 0) -> Array:
    """Y = take(data, indices, axis): Y.shape = data.shape[:axis] + indices.shape + data.shape[axis+1:].

    Negative indices count from the end (ONNX); out-of-range indices are an error.
    """
    idx = check_index("Gather", indices, data.shape[axis], "indices")
    return np.take(data, idx, axis=axis)


REFS: dict[str, RefFn] = {"Embedding": embedding, "Gather": gather}
