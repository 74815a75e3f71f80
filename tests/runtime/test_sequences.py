"""Several sequences on one Session: ``new_sequence``, ``prefill``, ``decode`` (batched over a KVBatch where the
backend has ``batched_kv``), ``release``.

What must hold: a sequence's results do not depend on the others (interleaved, batched or alone, bit for bit, and
equal to the session's own generate); every call is all-or-nothing per sequence; a released sequence, a full one, a
foreign one and bad arguments are refused with a message that names the problem; the session's own conversation is
not disturbed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from uaii.runtime import Session, SessionError

PROMPTS = ([1, 5, 9, 2], [7, 3], [4, 4, 4, 8, 12, 30], [60, 2, 17])


def _greedy(s: Session, seq: Any, prompt: list[int], n: int) -> list[int]:
    token = int(np.argmax(s.prefill(seq, prompt)))
    out = [token]
    while len(out) < n:
        out.append(int(np.argmax(s.decode([seq], [token])[0])))
        token = out[-1]
    return out


def test_interleaved_sequences_match_generate_and_each_other(tiny: Path) -> None:
    """Prefill all, then decode all together: every sequence's greedy ids equal the session's own generate; the
    batched logits equal each sequence decoded alone, bit for bit (a row does not depend on the batch)."""
    with Session(tiny, max_context=64) as s:
        refs = [s.generate(p, max_new_tokens=6).tokens for p in PROMPTS]
        seqs = [s.new_sequence() for _ in PROMPTS]
        firsts = [s.prefill(q, p) for q, p in zip(seqs, PROMPTS, strict=True)]
        outs = [[int(np.argmax(lg))] for lg in firsts]
        solo = [s.new_sequence() for _ in PROMPTS]
        for q, p in zip(solo, PROMPTS, strict=True):
            s.prefill(q, p)
        for _ in range(5):
            feed = [o[-1] for o in outs]
            together = s.decode(seqs, feed)
            alone = np.stack([s.decode([q], [t])[0] for q, t in zip(solo, feed, strict=True)])
            assert together.dtype == np.float32 and together.shape == (len(PROMPTS), s.graph.tensor("logits").shape[-1])
            np.testing.assert_array_equal(together, alone)
            for o, row in zip(outs, together, strict=True):
                o.append(int(np.argmax(row)))
        assert outs == refs
        assert [q.tokens for q in seqs] == [p + o[:-1] for p, o in zip(PROMPTS, outs, strict=True)]
        assert s.generate(PROMPTS[0], max_new_tokens=6).tokens == refs[0]  # the session's own cache is untouched


def test_batched_decode_uses_one_pass(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With batched_kv, decode of three sequences is one forward pass (on the second executable), not three."""
    with Session(tiny, max_context=64) as s:
        if not s.batched_decode:
            pytest.skip(f"the {s.backend} backend does not declare batched_kv")
        seqs = [s.new_sequence() for _ in range(3)]
        for q, p in zip(seqs, PROMPTS[:3], strict=True):
            s.prefill(q, p)
        passes: list[int] = []
        run = s._run

        def counting(feeds: Any, state: Any, exe: Any = None) -> Any:
            passes.append(len(feeds["tokens"]))
            return run(feeds, state, exe)

        monkeypatch.setattr(s, "_run", counting)
        s.decode(seqs, [1, 2, 3])
        assert passes == [3]


def test_prefill_in_chunks_equals_one_prefill(tiny: Path) -> None:
    """A prompt longer than max_batch runs in chunks with progress reports and gives the same logits."""
    prompt = [int(i) for i in np.random.default_rng(0).integers(0, 64, 20)]
    with Session(tiny, max_context=64, max_batch=8) as chunked, Session(tiny, max_context=64) as whole:
        seen: list[tuple[int, int]] = []
        a = chunked.prefill(chunked.new_sequence(), prompt, on_prefill=lambda d, t: seen.append((d, t)))
        b = whole.prefill(whole.new_sequence(), prompt)
        np.testing.assert_array_equal(a, b)
        assert seen == [(0, 20), (8, 20), (16, 20), (20, 20)]


@pytest.mark.parametrize("where", ["decode-batched", "decode-one", "prefill"])
def test_a_failed_pass_leaves_every_sequence_as_it_was(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                      where: str) -> None:
    """An exception inside the pass (here: KeyboardInterrupt after the backend ran) rewinds the sequences of the
    call: their tokens and KV states are as before, and the next call gives the logits a clean run gives."""
    with Session(tiny, max_context=64) as s:
        seqs = [s.new_sequence() for _ in range(2)]
        for q, p in zip(seqs, PROMPTS[:2], strict=True):
            s.prefill(q, p)
        before = [(list(q.tokens), q.state.length) for q in seqs]
        expected = s.decode(seqs, [5, 6]) if where != "prefill" else None
        for q, (toks, _) in zip(seqs, before, strict=True):  # undo the reference call
            del q.tokens[len(toks):]
            q.state.truncate(len(toks))
        run = s._run

        def interrupted(feeds: Any, state: Any, exe: Any = None) -> Any:
            run(feeds, state, exe)
            raise KeyboardInterrupt

        monkeypatch.setattr(s, "_run", interrupted)
        with pytest.raises(KeyboardInterrupt):
            if where == "prefill":
                s.prefill(seqs[0], [1, 2, 3])
            elif where == "decode-one" or not s.batched_decode:
                s.decode(seqs[:1], [5])
            else:
                s.decode(seqs, [5, 6])
        assert [(list(q.tokens), q.state.length) for q in seqs] == before
        monkeypatch.setattr(s, "_run", run)
        if expected is not None:
            np.testing.assert_array_equal(s.decode(seqs, [5, 6]), expected)


def test_release_frees_and_refuses(tiny: Path) -> None:
    with Session(tiny, max_context=64) as s, Session(tiny, max_context=64) as other:
        a, b = s.new_sequence(), s.new_sequence()
        s.prefill(a, [1, 2, 3])
        assert s.open_sequences == 2 and a.length == 3
        s.release(a)
        s.release(a)  # idempotent
        assert a.closed and a.state is None and s.open_sequences == 1
        with pytest.raises(SessionError, match=f"sequence {a.id} was released"):
            s.prefill(a, [4])
        with pytest.raises(SessionError, match="released"):
            s.decode([b, a], [1, 2])
        with pytest.raises(SessionError, match="not a sequence of this session"):
            other.prefill(b, [1])
        s.prefill(b, [1, 2])  # the other sequence is unaffected
        assert b.length == 2


def test_bad_decode_arguments_run_nothing(tiny: Path) -> None:
    with Session(tiny, max_context=64) as s:
        a, b = s.new_sequence(), s.new_sequence()
        s.prefill(a, [1, 2])
        s.prefill(b, [3])
        with pytest.raises(SessionError, match="one token per sequence: found 2 sequence"):
            s.decode([a, b], [1])
        with pytest.raises(SessionError, match="appears twice"):
            s.decode([a, a], [1, 2])
        with pytest.raises(SessionError, match=r"token ids must be in \[0, 64\), found 1..64"):
            s.decode([a, b], [1, 64])
        with pytest.raises(SessionError, match="nothing to prefill"):
            s.prefill(a, [])
        assert (a.length, b.length) == (2, 1) and (a.state.length, b.state.length) == (2, 1)


def test_a_full_sequence_is_refused_by_name(tiny: Path) -> None:
    """At the context, decode refuses the sequence (naming it) before any pass; prefill past it likewise."""
    with Session(tiny, max_context=8) as s:
        a, b = s.new_sequence(), s.new_sequence()
        s.prefill(a, list(range(1, 9)))
        s.prefill(b, [1])
        with pytest.raises(SessionError, match=f"sequence {a.id} is full: it holds 8 tokens, the context is 8"):
            s.decode([b, a], [2, 3])
        assert b.length == 1
        with pytest.raises(SessionError, match="do not fit the context"):
            s.prefill(b, list(range(1, 9)))


def test_closing_the_session_releases_its_sequences(tiny: Path) -> None:
    s = Session(tiny, max_context=64)
    a = s.new_sequence()
    s.prefill(a, [1, 2])
    s.close()
    assert a.closed and a.state is None
    s.release(a)  # still idempotent
    with pytest.raises(SessionError, match="closed"):
        s.new_sequence()


def test_the_batched_executable_runs_the_fused_graph(smollm2_path: Path) -> None:
    """Regression: the batched decode executable was compiled from the loader's unfused graph (SmolLM2: 573 nodes
    where the session's planned executable runs 424), so each row of a batched step paid ~1.2 ms more than a solo
    step. It runs the graph the session's plan fuses, less the last-row rewrite (a Slice): at most as many nodes."""
    with Session(smollm2_path, max_context=64) as s:
        a, b = s.new_sequence(), s.new_sequence()
        s.prefill(a, [1, 2, 3])
        s.prefill(b, [4, 5])
        s.decode([a, b], [6, 7])
        assert s._batch_exe is not None and s._exe is not None
        ops = [i.node.op for i in s._batch_exe.infos]
        assert len(ops) <= len(s._exe.infos)
        assert {"GroupedMatMul", "AddRMSNorm", "SwiGLU"} & set(ops)
