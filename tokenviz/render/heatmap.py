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


def pair_codes(matrix: np.ndarray, levels: int, gamma: float = 0.5) -> np.ndarray:
    """(ceil(rows / 2), cols) codes, one per terminal cell: upper * (levels + 1) + lower, where
    each is a colour index and `levels` stands for masked (NaN, and the padding row below an odd
    last row)."""
    idx = quantise(matrix, levels, gamma).astype(np.int32)
    if idx.shape[0] % 2:
        idx = np.vstack([idx, np.full((1, idx.shape[1]), -1, dtype=idx.dtype)])
    n = levels + 1
    return (idx[0::2] % n) * n + idx[1::2] % n


def run_segments(codes: np.ndarray, colors: list[str], masked: str) -> list[Segment]:
    """One terminal row of pair codes as Segments, neighbouring cells of one colour pair merged:
    a frame's cost downstream (Textual's filters, the compositor, the terminal) is per Segment."""
    if not len(codes):
        return []
    starts = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
    lengths = np.diff(np.append(starts, len(codes))).tolist()
    styles = _pair_styles((*colors, masked))
    return [Segment(_cells(length), styles[code]) for code, length in zip(codes[starts].tolist(), lengths)]


@functools.lru_cache(maxsize=4)
def _pair_styles(palette: tuple[str, ...]) -> list[Style]:
    """The Style of every (upper, lower) pair of palette colours, by pair code; kept across frames
    (a theme has one palette)."""
    return [Style(color=upper, bgcolor=lower) for upper in palette for lower in palette]


@functools.lru_cache(maxsize=512)
def _cells(length: int) -> str:
    return UPPER_HALF * length


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
