"""uaii.runtime.sampling: validation, each filter against a direct reference, distributions, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from uaii.ir import UaiiError
from uaii.runtime.sampling import GREEDY, Sampler, SamplingError, SamplingParams


def reference_candidates(logits, history, p: SamplingParams):
    """The pipeline written out directly (HF order), on float64: the ids that survive and their probabilities."""
    x = np.asarray(logits, dtype=np.float64).copy()
    for i in set(history):
        x[i] = x[i] / p.repetition_penalty if x[i] > 0 else x[i] * p.repetition_penalty
    if p.temperature == 0:
        return {int(np.argmax(x)): 1.0}
    x = x / p.temperature
    order = sorted(range(len(x)), key=lambda i: -x[i])
    if p.top_k:
        order = order[:p.top_k]
    e = np.exp(x[order] - x[order].max())
    probs = e / e.sum()
    if p.top_p < 1:
        keep, acc = 0, 0.0
        for q in probs:
            keep += 1
            acc += q
            if acc >= p.top_p - 1e-12:
                break
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    if p.min_p > 0:
        mask = probs >= p.min_p * probs.max()
        order = [i for i, m in zip(order, mask, strict=True) if m]
        probs = probs[mask] / probs[mask].sum()
    return {int(i): float(q) for i, q in zip(order, probs, strict=True)}


def chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


# ------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, needle", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"min_p": -0.01}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.0}, "repetition_penalty"),
    ({"seed": -1}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"temperature": "hot"}, "temperature"),
])
def test_out_of_range_values_are_clear_errors(kwargs, needle):
    with pytest.raises(SamplingError) as info:
        SamplingParams(**kwargs)
    msg = str(info.value)
    assert msg.startswith("[sampling] ") and needle in msg
    assert isinstance(info.value, UaiiError)


def test_defaults_are_greedy_and_frozen():
    p = SamplingParams()
    assert p.greedy and p == GREEDY
    assert p.to_dict() == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
                           "seed": None}
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # type: ignore[misc]
    assert SamplingParams(temperature=1, top_k=np.int64(3)).top_k == 3


def test_bad_logits():
    s = Sampler(SamplingParams(temperature=1.0, seed=0))
    with pytest.raises(SamplingError, match="NaN"):
        s.sample(np.array([0.0, np.nan, 1.0], dtype=np.float32))
    with pytest.raises(SamplingError, match="NaN"):
        Sampler().sample(np.array([0.0, np.nan, 1.0], dtype=np.float32))
    with pytest.raises(SamplingError, match="-inf"):
        Sampler().sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(SamplingError, match="shape"):
        s.sample(np.zeros((2, 3), dtype=np.float32))
    assert Sampler().sample(np.array([[0.0, 2.0, 1.0]], dtype=np.float32)) == 1  # (1, vocab) is accepted


# ------------------------------------------------------------------------------------------------------ greedy
def test_greedy_is_exact_argmax_first_max():
    x = np.array([0.5, 3.0, -1.0, 3.0, 2.9], dtype=np.float32)
    assert Sampler().sample(x) == 1
    rng = np.random.default_rng(1)
    for _ in range(20):
        y = rng.standard_normal(50_000).astype(np.float32)
        assert Sampler().sample(y) == int(np.argmax(y))


def test_greedy_with_repetition_penalty_moves_off_repeated_tokens():
    x = np.array([1.0, 5.0, 4.0, -2.0], dtype=np.float32)
    s = Sampler(SamplingParams(repetition_penalty=2.0))
    assert s.sample(x, history=[1]) == 2  # 5/2 = 2.5 < 4
    assert s.sample(x, history=[]) == 1
    assert x[1] == 5.0  # the caller's logits are never modified


def test_repetition_penalty_hf_style():
    x = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=1.0, repetition_penalty=2.0))
    y = s.penalized(x, [0, 1, 1, 99, -3])  # repeats count once; ids outside the vocabulary are ignored
    np.testing.assert_allclose(y, [1.0, -4.0, 1.0, 0.5])
    np.testing.assert_allclose(x, [2.0, -2.0, 1.0, 0.5])


# ----------------------------------------------------------------------------------------------------- filters
def test_top_k_keeps_the_k_largest():
    x = np.array([0.1, 2.0, 1.5, -1.0, 3.0, 0.0], dtype=np.float32)
    ids, probs = Sampler(SamplingParams(temperature=1.0, top_k=3)).candidates(x)
    assert ids.tolist() == [4, 1, 2]
    np.testing.assert_allclose(probs.sum(), 1.0)
    assert Sampler(SamplingParams(temperature=1.0, top_k=1)).candidates(x)[0].tolist() == [4]
    assert len(Sampler(SamplingParams(temperature=1.0, top_k=100)).candidates(x)[0]) == 6


def test_top_p_keeps_the_nucleus():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    x = np.log(probs).astype(np.float32)
    ids, kept = Sampler(SamplingParams(temperature=1.0, top_p=0.8)).candidates(x)
    assert ids.tolist() == [0, 1]  # 0.5 + 0.3 reaches 0.8
    np.testing.assert_allclose(kept, [0.5 / 0.8, 0.3 / 0.8], rtol=1e-5)
    assert Sampler(SamplingParams(temperature=1.0, top_p=0.81)).candidates(x)[0].tolist() == [0, 1, 2]
    assert Sampler(SamplingParams(temperature=1.0, top_p=0.1)).candidates(x)[0].tolist() == [0]


def test_top_p_on_a_large_vocabulary_uses_the_head_and_agrees_with_a_full_sort():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(262_144) * 4).astype(np.float32)  # peaked: the head holds the mass
    p = SamplingParams(temperature=0.7, top_p=0.9)
    ids, _ = Sampler(p).candidates(x)
    ref = reference_candidates(x, [], p)
    assert set(ids.tolist()) == set(ref)
    flat = rng.standard_normal(100_000).astype(np.float32) * 0.01  # flat: the full sort path
    ids2, _ = Sampler(SamplingParams(temperature=1.0, top_p=0.5)).candidates(flat)
    assert abs(len(ids2) - 50_000) < 500


def test_min_p_drops_the_improbable():
    probs = np.array([0.6, 0.25, 0.1, 0.05])
    x = np.log(probs).astype(np.float32)
    ids, _ = Sampler(SamplingParams(temperature=1.0, min_p=0.2)).candidates(x)
    assert sorted(ids.tolist()) == [0, 1]  # 0.1 < 0.2 * 0.6
    ids, _ = Sampler(SamplingParams(temperature=1.0, min_p=1.0)).candidates(x)
    assert ids.tolist() == [0]


def test_temperature_sharpens_and_flattens():
    x = np.log(np.array([0.7, 0.2, 0.1])).astype(np.float32)
    _, cold = Sampler(SamplingParams(temperature=0.5)).candidates(x)
    _, hot = Sampler(SamplingParams(temperature=2.0)).candidates(x)
    _, one = Sampler(SamplingParams(temperature=1.0)).candidates(x)
    np.testing.assert_allclose(one, [0.7, 0.2, 0.1], rtol=1e-5)
    assert cold[0] > 0.7 > hot[0]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.7),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    SamplingParams(repetition_penalty=1.5),
])
def test_candidates_match_the_reference_pipeline(params):
    rng = np.random.default_rng(11)
    for _ in range(25):
        x = (rng.standard_normal(40) * 2).astype(np.float32)
        history = rng.integers(0, 40, size=6).tolist()
        ids, probs = Sampler(params).candidates(x, history)
        ref = reference_candidates(x, history, params)
        assert {int(i): float(q) for i, q in zip(ids, probs, strict=True)} == pytest.approx(ref, rel=1e-5, abs=1e-9)


# ---------------------------------------------------------------------------------------------- distributions
@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, seed=0),
    SamplingParams(temperature=0.6, top_k=4, seed=1),
    SamplingParams(temperature=1.5, top_p=0.8, min_p=0.02, seed=2),
])
def test_draws_follow_the_filtered_distribution(params):
    x = np.log(np.array([0.35, 0.25, 0.15, 0.1, 0.08, 0.05, 0.02])).astype(np.float32)
    s = Sampler(params)
    ids, probs = s.candidates(x)
    n = 20_000
    counts = np.bincount([s.sample(x) for _ in range(n)], minlength=7)
    assert set(np.flatnonzero(counts)) <= set(ids.tolist())
    expected = np.zeros(7)
    expected[ids] = probs * n
    kept = expected > 0
    # chi-square with (k - 1) degrees of freedom; 99.9 % quantile for k <= 7 is below 22.5
    assert chi_square(counts[kept], expected[kept]) < 22.5


def test_same_seed_same_tokens_other_seed_other_tokens():
    rng = np.random.default_rng(5)
    steps = [(rng.standard_normal(1000) * 2).astype(np.float32) for _ in range(64)]
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    a = [Sampler(p).sample(x) for x in steps[:1]]
    s1, s2, s3 = Sampler(p), Sampler(p), Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=4321))
    run1 = [s1.sample(x) for x in steps]
    run2 = [s2.sample(x) for x in steps]
    run3 = [s3.sample(x) for x in steps]
    assert run1 == run2 and run1[:1] == a
    assert run1 != run3
    s1.reseed(1234)
    assert [s1.sample(x) for x in steps] == run1


@settings(max_examples=200, deadline=None)
@given(
    logits=arrays(np.float32, st.integers(1, 64),
                  elements=st.floats(-30, 30, allow_nan=False, allow_infinity=False, width=32)),
    temperature=st.sampled_from([0.0, 0.1, 0.7, 1.0, 2.5]),
    top_k=st.integers(0, 70),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    penalty=st.floats(0.5, 2.0),
    history=st.lists(st.integers(0, 63), max_size=10),
    seed=st.integers(0, 2**32),
)
def test_sampled_id_always_survives_the_filters(logits, temperature, top_k, top_p, min_p, penalty, history, seed):
    p = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=penalty,
                       seed=seed)
    s = Sampler(p)
    ids, probs = s.candidates(logits, history)
    assert len(ids) >= 1 and np.all(probs > 0) and probs.sum() == pytest.approx(1.0)
    if top_k:
        assert len(ids) <= top_k
    token = s.sample(logits, history)
    assert 0 <= token < len(logits)
    assert token in set(ids.tolist())
    if temperature == 0:
        assert token == int(np.argmax(s.penalized(logits, history)))


def test_ids_whose_probability_underflows_are_not_candidates():
    x = np.array([0.0, -5000.0, 10.0], dtype=np.float32)  # exp(-1000) is 0 in float64
    ids, probs = Sampler(SamplingParams(temperature=0.01)).candidates(x)
    assert ids.tolist() == [2] and probs.tolist() == [1.0]
