"""llama-perplexity's statistics (decoding.perplexity_statistics) against their definitions computed
directly in float64: the base's 16-bit log-probabilities, a token's KL divergence, Δp and top, and the
summary figures. (Equality with llama-perplexity's own output: tests/llamacpp/test_llamacpp_against_base.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.decoding.perplexity_statistics import (
    SPAN,
    STEPS,
    BaseLogProbs,
    Tally,
    TokenComparison,
    compare_token,
    percentile,
)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    return logits - logits.max() - math.log(np.exp(logits - logits.max()).sum())


logit_rows = st.lists(st.floats(-12, 12, width=32), min_size=2, max_size=64).map(
    lambda values: np.array(values, dtype=np.float32)
)


@settings(max_examples=200, deadline=None)
@given(logit_rows)
def test_the_bases_16_bit_log_probabilities_are_within_half_a_step_of_the_truth(logits):
    stored = BaseLogProbs.of(logits)
    truth = log_softmax(logits)
    kept = truth > truth.max() - SPAN
    step = stored.scale.item()
    assert step == pytest.approx((logits.max() - max(logits.min(), logits.max() - SPAN)) / STEPS, rel=1e-6)
    assert np.all(np.abs(stored.log_probs()[kept] - truth[kept]) <= step / 2 + 1e-5)


@settings(max_examples=200, deadline=None)
@given(logit_rows, logit_rows, st.integers(0, 63))
def test_a_tokens_kl_divergence_and_dp_are_their_definitions(q_values, base_values, token):
    n = min(len(q_values), len(base_values))
    q_logits, base_logits, token = q_values[:n], base_values[:n], token % n
    compared = compare_token(q_logits, BaseLogProbs.of(base_logits), token)
    q, base = log_softmax(q_logits), BaseLogProbs.of(base_logits).log_probs().astype(np.float64)
    kept = base > -SPAN
    assert compared.kld == pytest.approx(float((np.exp(base[kept]) * (base[kept] - q[kept])).sum()), abs=1e-5)
    assert compared.nll == pytest.approx(-q[token], abs=1e-5)
    assert compared.p_diff == pytest.approx(math.exp(q[token]) - math.exp(base[token]), abs=1e-5)
    assert compared.top == int(np.argmax(q_logits)) and compared.top_base == int(np.argmax(base))


def test_the_same_model_on_both_sides_changes_nothing():
    rows = np.random.default_rng(3).normal(0, 3, (40, 500)).astype(np.float32)
    tally = Tally()
    for i, row in enumerate(rows):
        tally.add(compare_token(row, BaseLogProbs.of(row), i))
    s = tally.statistics()
    assert s["mean_kld"] == pytest.approx(0, abs=1e-6) and s["same_top_p"] == 1.0
    assert s["rms_dp"] == pytest.approx(0, abs=1e-4) and s["ln_ppl_ratio"] == pytest.approx(0, abs=1e-5)
    assert s["correlation"] == pytest.approx(1.0, abs=1e-3)


def test_the_summary_is_llama_perplexitys_means_errors_and_percentiles():
    klds = [0.01 * (i + 1) for i in range(20)]
    tokens = [TokenComparison(1.0 + i / 10, 1.0, k, 0.01 * (-1) ** i, i % 3, 0) for i, k in enumerate(klds)]
    tally = Tally(tokens)
    s = tally.statistics()
    values = np.array(klds)
    assert s["mean_kld"] == pytest.approx(values.mean())
    assert s["mean_kld_unc"] == pytest.approx(values.std() / math.sqrt(len(values) - 1))  # its standard error
    assert s["median_kld"] == pytest.approx(np.median(values)) and s["max_kld"] == pytest.approx(0.2)
    assert s["kld_p90"] == pytest.approx(np.percentile(values, 90))  # linear between the two nearest
    assert s["same_top_p"] == pytest.approx(7 / 20)  # top 0 on both sides: i = 0, 3, ..., 18
    assert s["rms_dp"] == pytest.approx(0.01) and s["mean_dp"] == pytest.approx(0)
    nll = np.array([t.nll for t in tokens])
    assert s["ppl_q"] == pytest.approx(math.exp(nll.mean())) and s["ppl_base"] == pytest.approx(math.e)
    assert percentile(np.sort(values), 0) == pytest.approx(0.01) and percentile(np.sort(values), 1) == 0.2
