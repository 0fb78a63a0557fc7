"""What a quantization changes, in llama-perplexity's terms (`--kl-divergence`): the statistics of a model
Q scored beside a base model over the same windows of a text, each defined as llama.cpp defines them,
so the figures are the ones its users publish.

For every scored token, from the two models' logits there: the negative log-likelihoods of the text's
next token (nll, nll_base), the KL divergence KL(base || Q) summed over the tokens the base gives more
than e^-16, Δp (Q's probability of the text's token minus the base's) and whether both put their most
probability on the same token. The base's log-probabilities are kept as llama-perplexity keeps them in
its `--kl-divergence-base` file: each its 16-bit step over the base's top 16 nats (`BaseLogProbs`); its
statistics are then equal to llama-perplexity's, not near them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SPAN = 16.0  # nats below the base's top logit that its 16-bit log-probabilities cover (and the KLD sums)
STEPS = 65535.0
MIN_COUNT_FOR_SPREAD = 10  # llama-perplexity gives no uncertainty below this many tokens
KLD_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.10, 0.05, 0.01, 0.001)
DP_PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.75, 0.25, 0.10, 0.05, 0.01, 0.001)
# Where a side gives its top N only (a served model), a token's KLD is NaN and every KLD figure None:
KLD_NOT_GIVEN = "KLD: a side gives its top N only (a served model), and the KLD is a sum over every token"


def log_sum_exp(logits: np.ndarray, top: np.ndarray) -> np.ndarray:
    """log(sum(exp(logit - top))) of each row, as llama-perplexity sums it: float32 terms in a double sum,
    its log rounded to float32."""
    total = np.exp(logits - top, dtype=np.float32).sum(axis=-1, keepdims=True, dtype=np.float64)
    rounded: np.ndarray = np.log(total).astype(np.float32)
    return rounded


@dataclass(frozen=True)
class BaseLogProbs:
    """Positions of the base model as llama-perplexity stores them: log p(i) = scale * steps[i] + floor,
    a token under the base's top 16 nats at the floor. A row of the vocabulary each (or one row)."""

    scale: np.ndarray  # float32, a row's
    floor: np.ndarray  # float32: the lowest log-probability kept (llama-perplexity's min_log_prob)
    steps: np.ndarray  # uint16, one per token

    @classmethod
    def of(cls, logits: np.ndarray) -> BaseLogProbs:
        """As llama-perplexity's log_softmax that writes its base file (float32, as it computes)."""
        logits = np.asarray(logits, dtype=np.float32)
        top = logits.max(axis=-1, keepdims=True)
        bottom = np.maximum(logits.min(axis=-1, keepdims=True), top - np.float32(SPAN))
        floor = bottom - top - log_sum_exp(logits, top)
        scale = (top - bottom) / np.float32(STEPS)
        with np.errstate(divide="ignore"):
            inverse = np.where(scale > 0, np.float32(1) / scale, np.float32(0))  # (a flat row: every step 0)
        steps = np.where(logits > bottom, np.rint(inverse * (logits - bottom)), 0).astype(np.uint16)
        return cls(scale, floor, steps)

    def log_probs(self) -> np.ndarray:
        rows: np.ndarray = self.scale * self.steps.astype(np.float32) + self.floor
        return rows


@dataclass(frozen=True)
class TokenComparison:
    """One scored token: Q's and the base's negative log-likelihood of the text's token there, the KL
    divergence KL(base || Q), Δp, and both models' top token."""

    nll: float
    nll_base: float
    kld: float
    p_diff: float
    top: int
    top_base: int


def compare_tokens(logits: np.ndarray, base: BaseLogProbs, tokens: np.ndarray) -> list[TokenComparison]:
    """llama-perplexity's comparison of each row (its `log_softmax` over Q's logits and the base's stored
    log-probabilities), in float32 where it computes in float32: rows of Q's logits, the base's rows, and
    the text's token each row predicts."""
    logits = np.asarray(logits, dtype=np.float32)
    rows = np.arange(len(logits))
    top = logits.argmax(axis=-1)
    shift = logits[rows, top][:, None]
    shift = shift + log_sum_exp(logits, shift)  # llama-perplexity's max_logit + log_sum_exp
    nll = shift[:, 0] - logits[rows, tokens]
    base_log = base.log_probs()
    nll_base = -base_log[rows, tokens]
    terms = np.exp(base_log, dtype=np.float32) * (base_log - logits + shift)
    kld = np.where(base_log > np.float32(-SPAN), terms, np.float32(0)).sum(axis=-1, dtype=np.float64)
    p_diff = np.exp(-nll, dtype=np.float32) - np.exp(-nll_base, dtype=np.float32)
    top_base = base_log.argmax(axis=-1)
    columns = zip(nll.tolist(), nll_base.tolist(), kld.tolist(), p_diff.tolist(), top.tolist(), top_base.tolist())
    return [TokenComparison(*column) for column in columns]


def compare_token(logits: np.ndarray, base: BaseLogProbs, token: int) -> TokenComparison:
    """compare_tokens of one row."""
    one = BaseLogProbs(np.atleast_2d(base.scale), np.atleast_2d(base.floor), np.atleast_2d(base.steps))
    return compare_tokens(np.atleast_2d(logits), one, np.array([token]))[0]


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """The mean and its standard error, as llama-perplexity gives them (no error under 11 values)."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    spread = total2 / count - mean * mean
    return mean, math.sqrt(spread / (count - 1)) if spread > 0 and count > MIN_COUNT_FOR_SPREAD else 0.0


def percentile(values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's percentile of sorted `values`: linear between the two nearest."""
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    at = np.float32(fraction) * np.float32(len(values) - 1)
    low = int(at)
    part = float(at) - low
    return (1 - part) * float(values[low]) + part * float(values[min(low + 1, len(values) - 1)])


def percentile_key(figure: str, fraction: float) -> str:
    """A percentile's name in the statistics: kld_p99.9, dp_p5..."""
    return f"{figure}_p{fraction * 100:g}"


def median(values: np.ndarray) -> float:
    n = len(values)
    return float(values[n // 2]) if n % 2 else 0.5 * (float(values[n // 2]) + float(values[n // 2 - 1]))


@dataclass
class Tally:
    """The tokens compared so far, and llama-perplexity's statistics of them."""

    tokens: list[TokenComparison] = field(default_factory=list)

    def add(self, token: TokenComparison) -> None:
        self.tokens.append(token)

    def statistics(self) -> dict[str, Any]:
        """Every figure llama-perplexity prints after `--kl-divergence`, by name; each `*_unc` is its
        uncertainty as llama-perplexity gives it; the Δp figures are fractions (it prints percents). Where a
        token's KLD is not known, the KLD figures are None, named in "not_given"."""
        count = len(self.tokens)
        if count == 0:
            raise ValueError("no token was scored")
        nll = np.array([t.nll for t in self.tokens], np.float64)
        base = np.array([t.nll_base for t in self.tokens], np.float64)
        kld = np.array([t.kld for t in self.tokens], np.float64)
        dp = np.array([t.p_diff for t in self.tokens], np.float64)
        log_ppl, log_ppl_unc = mean_and_uncertainty(nll.sum(), (nll * nll).sum(), count)
        log_base, log_base_unc = mean_and_uncertainty(base.sum(), (base * base).sum(), count)
        cov = (
            ((nll * base).sum() / count - (nll.sum() / count) * (base.sum() / count)) / (count - 1)
            if count >= 10
            else 0.0
        )
        ratio_unc = math.sqrt(max(0.0, log_ppl_unc**2 + log_base_unc**2 - 2 * cov))
        ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
        ppl_unc, ppl_base_unc = ppl * log_ppl_unc, ppl_base * log_base_unc
        mean_kld, mean_kld_unc = mean_and_uncertainty(kld.sum(), (kld * kld).sum(), count)
        mean_dp, mean_dp_unc = mean_and_uncertainty(dp.sum(), (dp * dp).sum(), count)
        mse, mse_unc = mean_and_uncertainty((dp * dp).sum(), (dp**4).sum(), count)
        rms = math.sqrt(mse)
        same = sum(t.top == t.top_base for t in self.tokens) / count
        sorted_kld = np.sort(np.array([t.kld for t in self.tokens], np.float32))
        sorted_dp = np.sort(np.array([t.p_diff for t in self.tokens], np.float32))
        figures = {
            "count": count,
            "ppl_q": ppl,
            "ppl_q_unc": ppl_unc,
            "ppl_base": ppl_base,
            "ppl_base_unc": ppl_base_unc,
            "correlation": cov / (log_ppl_unc * log_base_unc) if log_ppl_unc and log_base_unc else None,
            "ln_ppl_ratio": log_ppl - log_base,
            "ln_ppl_ratio_unc": ratio_unc,
            "ppl_ratio": math.exp(log_ppl - log_base),
            "ppl_ratio_unc": math.exp(log_ppl - log_base) * ratio_unc,
            "ppl_diff": ppl - ppl_base,
            "ppl_diff_unc": math.sqrt(max(0.0, ppl_unc**2 + ppl_base_unc**2 - 2 * ppl * ppl_base * cov)),
            "mean_kld": mean_kld,
            "mean_kld_unc": mean_kld_unc,
            "max_kld": float(sorted_kld[-1]),
            **{percentile_key("kld", f): percentile(sorted_kld, f) for f in KLD_PERCENTILES},
            "median_kld": median(sorted_kld),
            "min_kld": float(sorted_kld[0]),
            "mean_dp": mean_dp,
            "mean_dp_unc": mean_dp_unc,
            "max_dp": float(sorted_dp[-1]),
            **{percentile_key("dp", f): percentile(sorted_dp, f) for f in DP_PERCENTILES},
            "median_dp": median(sorted_dp),
            "min_dp": float(sorted_dp[0]),
            "rms_dp": rms,
            "rms_dp_unc": 0.5 / rms * mse_unc if rms else 0.0,
            "same_top_p": same,
            "same_top_p_unc": math.sqrt(same * (1 - same) / (count - 1)) if count > 1 else 0.0,
        }
        if not self.kld_known:
            return {name: None if "kld" in name else value for name, value in figures.items()} | {
                "not_given": [KLD_NOT_GIVEN]
            }
        return figures

    @property
    def kld_known(self) -> bool:
        """Whether every token's KLD is known (NaN: a side gave its top N only)."""
        return not any(math.isnan(t.kld) for t in self.tokens)
