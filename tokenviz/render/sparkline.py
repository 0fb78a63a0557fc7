"""Sparklines: a series as one row of eighth-height blocks."""

from __future__ import annotations

from collections.abc import Sequence

SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, top: float | None = None) -> str:
    """The last `width` values, scaled so `top` (by default the largest) is a full block; a value
    above zero is never drawn as nothing."""
    values = values[-width:]
    top = top if top is not None else max(values) if values else 0
    if not top:
        return ""
    return "".join(SPARK[min(max(round(v / top * 8), 1 if v > 0 else 0), 8)] for v in values)
