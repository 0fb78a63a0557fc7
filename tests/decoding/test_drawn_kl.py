"""The KL a drawn step's record gives with interventions on a served model: a floor from two top-Ns,
never above the whole vocabulary's KL, and the KL itself where the top-Ns hold every token."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.decoding.drawn import kl_floor


def whole_kl(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.sum(p * (np.log2(p) - np.log2(q))))


def top(p: np.ndarray, n: int) -> dict[int, float]:
    """The `n` likeliest tokens' log-probabilities, as a server returns them."""
    return {int(t): math.log(p[t]) for t in np.argsort(-p)[:n]}


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=2, max_value=60),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.floats(min_value=0.1, max_value=8.0),
)
def test_the_floor_never_exceeds_the_whole_vocabularys_kl(vocab, n, seed, spread):
    rng = np.random.default_rng(seed)
    p, q = (np.exp(spread * rng.standard_normal(vocab)) for _ in range(2))
    p, q = p / p.sum(), q / q.sum()
    floor = kl_floor(top(p, n), top(q, n))
    assert 0.0 <= floor <= whole_kl(p, q) + 1e-9


def test_the_floor_is_the_kl_where_both_tops_hold_every_token():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    assert abs(kl_floor(top(p, 4), top(q, 4)) - whole_kl(p, q)) < 1e-9
    assert kl_floor(top(p, 4), top(p, 4)) < 1e-9  # (the same distribution: nothing between them)
    assert kl_floor(top(p, 2), top(q, 2)) > 0  # (two tokens known of each still tell them apart)
