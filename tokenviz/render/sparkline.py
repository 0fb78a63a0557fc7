"""Sparklines: a series as one row of eighth-height blocks."""

from __future__ import annotations

import math
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


LOG_FLOOR = 1e-6  # a log sparkline's lowest level: p at or below it is drawn as the lowest block


def log_sparkline(values: Sequence[float], width: int, floor: float = LOG_FLOOR) -> str:
    """The last `width` probabilities on one log scale from `floor` to 1 (shared by every series
    drawn with it: p 5e-05 never looks as large as p 0.3); a value above zero is never nothing."""
    span = -math.log10(floor)

    def level(p: float) -> int:
        if p <= 0:
            return 0
        return min(max(round((math.log10(max(p, floor)) + span) / span * 8), 1), 8)

    return "".join(SPARK[level(v)] for v in values[-width:])
