"""Horizontal bars with eighth blocks, for sub-cell precision."""

from __future__ import annotations

EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int) -> str:
    """A bar `width` cells wide filled to `fraction` (0..1), padded with spaces."""
    if width <= 0:
        return ""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[rest] if rest else "")
    return text.ljust(width)
