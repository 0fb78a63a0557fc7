"""Sparklines: a series as one row of eighth-height blocks."""

from __future__ import annotations

SPARK = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int) -> str:
    """The last `width` values, scaled so the largest is a full block."""
    values = values[-width:]
    top = max(values) if values else 0
    if not top:
        return ""
    return "".join(SPARK[min(round(v / top * 8), 8)] for v in values)
