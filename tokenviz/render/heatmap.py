"""Attention heatmaps as rich Segments: half-block cells, two matrix rows per terminal row.

The upper matrix row is the foreground of '▀', the lower row its background. Masked cells
(the causal future) are NaN and drawn in the background colour. Without colour (NO_COLOR) a cell
is a shade glyph instead, for the larger of its two rows.
"""

from __future__ import annotations

import functools

import numpy as np
from rich.segment import Segment
from rich.style import Style

UPPER_HALF = "▀"
SHADES = " ·░▒▓█"  # no colour: low to high
MASKED_SHADE = " "


def quantise(matrix: np.ndarray, levels: int, gamma: float = 0.5) -> np.ndarray:
    """Values in [0, 1] -> colour indices; gamma < 1 lifts small weights into view. NaN -> -1."""
    m = np.nan_to_num(np.asarray(matrix, dtype=np.float32), nan=-1.0)
    idx = np.round(np.clip(m, 0, 1) ** gamma * (levels - 1)).astype(np.int16)
    idx[m < 0] = -1
    return idx


def heatmap_lines(
    matrix: np.ndarray, colors: list[str], masked: str, gamma: float = 0.5, shades: bool = False
) -> list[list[Segment]]:
    """One list of Segments per terminal row, for a (rows, cols) matrix of values in [0, 1]."""
    if shades:
        return shade_lines(matrix, gamma)
    idx = quantise(matrix, len(colors), gamma)
    if idx.shape[0] % 2:
        idx = np.vstack([idx, np.full((1, idx.shape[1]), -1, dtype=idx.dtype)])
    palette = colors + [masked]  # index -1 picks `masked`
    lines = []
    for top, bottom in zip(idx[0::2], idx[1::2]):
        segments: list[Segment] = []
        for a, b in zip(top.tolist(), bottom.tolist()):
            style = _style(palette[a], palette[b])
            if segments and segments[-1].style is style:
                segments[-1] = Segment(segments[-1].text + UPPER_HALF, style)
            else:
                segments.append(Segment(UPPER_HALF, style))
        lines.append(segments)
    return lines


@functools.lru_cache(maxsize=8192)
def _style(color: str, bgcolor: str) -> Style:
    """One Style per pair of colours, kept across frames (a long context has one per cell)."""
    return Style(color=color, bgcolor=bgcolor)


def shade_lines(matrix: np.ndarray, gamma: float = 0.5) -> list[list[Segment]]:
    idx = quantise(matrix, len(SHADES), gamma)
    if idx.shape[0] % 2:
        idx = np.vstack([idx, np.full((1, idx.shape[1]), -1, dtype=idx.dtype)])
    pairs = np.maximum(idx[0::2], idx[1::2])
    return [[Segment("".join(SHADES[i] if i >= 0 else MASKED_SHADE for i in row.tolist()))] for row in pairs]


def legend(colors: list[str], width: int, gamma: float = 0.5, shades: bool = False) -> list[Segment]:
    """A colour bar (or a shade bar, without colour) from 0 to 1 on the same scale as the heatmap."""
    width = max(width, 2)
    values = np.linspace(0, 1, width)
    if shades:
        return [Segment("".join(SHADES[i] for i in quantise(values[None, :], len(SHADES), gamma)[0].tolist()))]
    idx = quantise(values[None, :], len(colors), gamma)[0]
    return [Segment(" ", Style(bgcolor=colors[i])) for i in idx.tolist()]
