"""How raw bytes become the array a store hands out: plain dtypes as numpy views, block types as uint8."""

from __future__ import annotations

import numpy as np

from uaii.storage.location import WeightLocation


def as_tensor(raw: np.ndarray, loc: WeightLocation) -> np.ndarray:
    """A read-only view of ``raw`` (uint8, ``loc.nbytes`` long) with ``dtype``/``shape`` for plain types."""
    out = raw if loc.dtype.is_quantized else raw.view(loc.dtype.numpy).reshape(loc.shape)
    out.flags.writeable = False
    return out
