"""Embeddings: one unit-norm vector per text (or token-id list), for ``Session.embed`` and ``POST /v1/embeddings``.

Two kinds of model give them:

* **encoders** (BERT and its kin, graphs without a KV cache): the graph's ``pooled`` output, as the loader built it
  from the model's pooling (CLS, HF's pooler, mean, last: see uaii.loaders.arch.bert); a graph without one (GGUF
  ``pooling_type`` 0) is mean-pooled over its ``hidden_states``. The session's own executable runs it, one input
  per pass; the inputs are ``tokens``, ``positions`` (0..n-1) and ``token_types`` (all 0, one segment) where the
  graph has them. An input longer than the position table is refused: learned positions do not extrapolate.
* **decoder LMs**: the mean over the tokens of the final hidden states (after the final norm: the rows the lm_head
  multiplies). :func:`uaii.runtime.rewrite.hidden_state_output` removes the head, so no vocabulary-wide product is
  computed; that graph is compiled once per session, lazily (on the session's store and backend, as ``run()``
  compiles its functional graph), and fed in chunks of ``max_batch`` through a KV state of its own that lives for
  one call — the session's conversation cache, and an engine's sequences, are never touched.

Vectors are L2-normalized, as OpenAI's embeddings are (a dot product is then the cosine similarity); a zero vector
stays zero. The work holds the session guard, so it never interleaves with a forward pass of another thread (the
serving engine's worker waits between two of its steps, and runs between two inputs of a long request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from uaii.runtime.capabilities import compile_options
from uaii.runtime.errors import SessionError
from uaii.runtime.rewrite import hidden_state_output

if TYPE_CHECKING:
    from uaii.backends.base import Executable
    from uaii.runtime.session import Session

EmbeddingInput = str | Sequence[int]
ENCODER_FEEDS = ("tokens", "positions", "token_types")
NO_INPUT = "no input: pass a text, a list of texts, a token-id list or a list of them"


class EmbeddingError(SessionError):
    """An input the model cannot embed: empty, too long for its positions, token ids outside its vocabulary."""

    component = "embeddings"


@dataclass
class Embedder:
    """How one session's model turns token ids into a vector (cached on the session: ``session._embedder``).

    kind: ``pooled`` (an encoder's pooled output), ``mean`` (the mean of an encoder's per-token states) or
    ``decoder`` (the mean of a decoder's final hidden states). ``exe`` is the hidden-state executable of a decoder
    (the session closes it with its own); an encoder runs on the session's executable."""

    kind: str
    dim: int
    max_tokens: int  # the longest input, in tokens
    vocab: int
    chunk: int  # tokens per pass (a decoder's prefill chunk)
    exe: Executable | None = None

    def close(self) -> None:
        if self.exe is not None:
            self.exe.close()
            self.exe = None

    def check(self, ids: list[list[int]], model: str) -> None:
        """Every input is refused before any runs: empty, longer than ``max_tokens``, ids out of the vocabulary."""
        if not ids:
            raise EmbeddingError(NO_INPUT)
        for i, row in enumerate(ids):
            where = f"input {i}" if len(ids) > 1 else "the input"
            if not row:
                raise EmbeddingError(f"{where} is empty (no tokens); {model} embeds at least one token")
            if len(row) > self.max_tokens:
                raise EmbeddingError(f"{where} has {len(row)} tokens, more than the {self.max_tokens} {model} can "
                                     "embed at once (its positions or the context); shorten or split it")
            lo, hi = min(row), max(row)
            if lo < 0 or hi >= self.vocab:
                raise EmbeddingError(f"{where}: token ids must be in [0, {self.vocab}) for {model}, found {lo}..{hi}")


def embed(session: Session, inputs: EmbeddingInput | Sequence[EmbeddingInput], *, normalize: bool = True
          ) -> np.ndarray:
    """Embeddings ``[n, d]`` (float32) of ``inputs``: a text, a list of texts, a token-id list or a list of them
    (the OpenAI ``input`` shapes). Texts are tokenized with the model's special tokens (BOS/CLS/SEP)."""
    return embed_tokens(session, token_lists(session, inputs), normalize=normalize)


def token_lists(session: Session, inputs: EmbeddingInput | Sequence[EmbeddingInput]) -> list[list[int]]:
    """``inputs`` as one token-id list per embedding (see :func:`embed`)."""
    items: list[Any] = [inputs] if isinstance(inputs, str) or _is_ids(inputs) else list(inputs)
    if not items:
        raise EmbeddingError(NO_INPUT)
    out: list[list[int]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append(session.tokenize(item, add_special=True))
        elif _is_ids(item) or (isinstance(item, Sequence | np.ndarray) and len(item) == 0):
            out.append([int(t) for t in item])  # an empty one is refused by Embedder.check, naming it
        else:
            raise EmbeddingError(f"input {i}: expected a text or a list of token ids, found {type(item).__name__}")
    return out


def embed_tokens(session: Session, ids: list[list[int]], *, normalize: bool = True) -> np.ndarray:
    """Embeddings ``[len(ids), d]`` of token-id lists; all are checked before any runs (:meth:`Embedder.check`).
    The session guard is held per input, not for the whole call: the engine's streams go on between two inputs of
    a long request."""
    with session._guard.hold("embed"):
        session._ready("embed")
        embedder = embedder_of(session)
        embedder.check(ids, session._bundle.path.name)
    state: Any = None  # a decoder's KV state, as long as the longest input: made once, emptied per input
    rows = []
    for row in ids:
        with session._guard.hold("embed"):
            session._ready("embed")  # closed (an unloaded model) between two inputs: SessionError
            if embedder.kind != "decoder":
                rows.append(_encoder_vector(session, embedder, row))
                continue
            if state is None:
                assert embedder.exe is not None
                state = embedder.exe.new_state(max(len(r) for r in ids))
            rows.append(_decoder_vector(session, embedder, state, row))
    out = np.stack(rows).astype(np.float32)
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)
    return out


def embedder_dim(session: Session) -> int:
    """The length of the session's embeddings (its :class:`Embedder` is made if it was not)."""
    with session._guard.hold("embed"):
        session._ready("embed")
        return embedder_of(session).dim


def embedder_of(session: Session) -> Embedder:
    """The session's :class:`Embedder`, made on first use (a decoder's graph is compiled then)."""
    found: Embedder | None = getattr(session, "_embedder", None)
    if found is None:
        found = _decoder(session) if session.generative else _encoder(session)
        session._embedder = found
    return found


# --- encoders --------------------------------------------------------------------------------------------------
def _encoder(session: Session) -> Embedder:
    graph, name = session.graph, session._bundle.path.name
    extra = [n for n in graph.inputs if n not in ENCODER_FEEDS]
    if "tokens" not in graph.inputs or extra:
        raise EmbeddingError(f"{name} is not an embedding model: its graph takes {', '.join(graph.inputs)} "
                             f"(an encoder takes {', '.join(ENCODER_FEEDS)}; a decoder LM tokens, positions and a "
                             "KV cache)")
    out = "pooled" if "pooled" in graph.outputs else "hidden_states"
    if out not in graph.outputs:
        raise EmbeddingError(f"{name} has no 'pooled' or 'hidden_states' output (outputs: "
                             f"{', '.join(graph.outputs)}); nothing to embed with")
    limit = min((x for x in (session.context, _position_rows(graph)) if x > 0), default=1 << 30)
    return Embedder("pooled" if out == "pooled" else "mean", int(graph.tensor(out).shape[-1]), limit,
                    _vocab(graph, "tokens"), limit)


def _encoder_vector(session: Session, embedder: Embedder, ids: list[int]) -> np.ndarray:
    exe, graph = session._exe, session.graph
    assert exe is not None  # the guard lets nothing run on a closed session
    n = len(ids)
    feeds = {"tokens": np.asarray(ids, np.int64), "positions": np.arange(n, dtype=np.int64),
             "token_types": np.zeros(n, np.int64)}
    out = exe.run({k: v for k, v in feeds.items() if k in graph.inputs})
    if embedder.kind == "pooled":
        return np.array(out["pooled"], np.float32).reshape(-1)
    return np.asarray(out["hidden_states"], np.float64).mean(axis=0)


def _position_rows(graph: Any) -> int:
    """Rows of the table the ``positions`` input looks up (learned positions), 0 when there is none."""
    for node in graph.nodes:
        if node.op in ("Embedding", "Gather") and node.inputs[:1] == ("positions",) and len(node.inputs) > 1:
            shape = graph.tensor(node.inputs[1]).shape
            if shape and isinstance(shape[0], int):
                return int(shape[0])
    return 0


def _vocab(graph: Any, feed: str) -> int:
    """Rows of the table the ``feed`` input looks up (the vocabulary), else unbounded."""
    for node in graph.nodes:
        if node.op in ("Embedding", "Gather") and node.inputs[:1] == (feed,) and len(node.inputs) > 1:
            shape = graph.tensor(node.inputs[1]).shape
            if shape and isinstance(shape[0], int):
                return int(shape[0])
    return 1 << 62


# --- decoders --------------------------------------------------------------------------------------------------
def _decoder(session: Session) -> Embedder:
    backend, o = session.backend, session.options
    assert backend is not None
    graph = hidden_state_output(session._bundle.graph)
    exe = backend.compile(graph, None, session._store,
                          **compile_options(backend.capabilities, o, session._device_kw))
    return Embedder("decoder", int(graph.tensor("hidden_states").shape[-1]), session.context,
                    _vocab(session.graph, "tokens"), max(o.max_batch, 1), exe)


def _decoder_vector(session: Session, embedder: Embedder, state: Any, row: list[int]) -> np.ndarray:
    """The mean final hidden state of ``row``, run through ``state`` (emptied first) in chunks of
    ``embedder.chunk`` tokens."""
    exe = embedder.exe
    assert exe is not None
    state.reset()
    total = np.zeros(embedder.dim, np.float64)
    for start in range(0, len(row), embedder.chunk):
        part = row[start:start + embedder.chunk]
        feeds = {"tokens": np.asarray(part, np.int64), "positions": np.arange(start, start + len(part), dtype=np.int64)}
        total += np.asarray(exe.run(feeds, state)["hidden_states"], np.float64).sum(axis=0)
    return total / len(row)


def _is_ids(x: object) -> bool:
    """A token-id list: a non-string sequence of ints (numpy integers and arrays included)."""
    if isinstance(x, np.ndarray):
        return x.ndim == 1 and x.dtype.kind in "iu"
    return (isinstance(x, Sequence) and not isinstance(x, str | bytes) and len(x) > 0
            and all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in x))


__all__ = ["Embedder", "EmbeddingError", "EmbeddingInput", "embed", "embed_tokens", "embedder_dim", "embedder_of",
           "token_lists"]
