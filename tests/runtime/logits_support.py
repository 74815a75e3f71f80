"""The logits of every row of a prompt through a Session's CPU backend (Session.run: the functional graph, an empty
cache), for comparisons against another framework's forward pass."""

from __future__ import annotations

import numpy as np

from uaii.runtime import Session


def prompt_logits(session: Session, tokens: np.ndarray) -> np.ndarray:
    """[len(tokens), vocab] float32 logits of ``tokens`` at positions 0.."""
    feeds = {"tokens": tokens, "positions": np.arange(tokens.size, dtype=np.int64)}
    for t in session.graph.inputs:
        if t.startswith("past_"):
            feeds[t] = np.zeros((0, *session.graph.tensor(t).shape[1:]), np.float32)
    return session.run(feeds)["logits"]
