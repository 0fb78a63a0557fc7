"""Quantities written for people."""

from __future__ import annotations

import math


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (binary units, up to GB)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def probability(p: float, width: int = 0) -> str:
    """A probability that never reads 0 unless it is 0: 0.483, or 2.8e-05 below a thousandth."""
    text = "0" if p == 0 else f"{p:.3f}" if p >= 0.0005 else f"{p:.1e}"
    return text.rjust(width)


def draw_digits(low: float, high: float) -> int:
    """The decimals a draw's band needs to read as an interval, not a point: 4, or as many as set its ends
    apart ([0.99931, 0.99937), not [0.9993, 0.9993)), at most 12."""
    width = high - low
    if width <= 0 or not math.isfinite(width):
        return 4
    return max(4, min(12, math.ceil(-math.log10(width))))


def elapsed(ms: float) -> str:
    """A time taken, in the unit a person reads it in: '12.3 ms', '4.2 s', '3 min 51 s' (not '230692.6 ms')."""
    if ms < 1000:
        return f"{ms:.1f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return duration(ms / 1000)


def duration(seconds: float) -> str:
    """A time left, as a person says it: '4 s', '2 min 5 s', '1 h 20 min'."""
    s = max(round(seconds), 1)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"
