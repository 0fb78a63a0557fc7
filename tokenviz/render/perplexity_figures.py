"""A comparison's steps in llama-perplexity's terms, as one line: the figures the app's diff pane and
compare's table both show (journey.comparison's statistics, B the base)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def perplexity_figures(statistics: Mapping[str, Any]) -> str:
    """The mean KLD in nats (not given where B gave its top N only), how often the top-1s agree, the RMS of
    Δp and the perplexity ratio PPL(A)/PPL(B)."""
    kld = statistics["mean_kld"]
    return " · ".join(
        (
            "mean KLD not given (top N)" if kld is None else f"mean KLD {kld:.4f} nats",
            f"same top {statistics['same_top_p']:.1%}",
            f"RMS Δp {statistics['rms_dp']:.2%}",
            f"PPL ratio {statistics['ppl_ratio']:.4f}",
        )
    )
