"""Textual's ANSI-to-truecolor line filter, skipped for lines that need no change.

Textual runs ANSIToTruecolor over every segment of every line it draws and builds a new segment
for each, even when the style is already truecolor. tokenviz draws in truecolor, and an attention
heatmap at a long context is thousands of segments a frame: the filter was a third of a frame's
cost at 200x60. Here only the segments whose style would change are rebuilt, by Textual's own
truecolor_style, so what reaches the terminal is the same.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.filter import ANSIToTruecolor, LineFilter


def changes(style: Style) -> bool:
    """Whether ANSIToTruecolor.truecolor_style would change this style (its own three tests)."""
    color, bgcolor = style.color, style.bgcolor
    return (
        (color is not None and color.triplet is None)
        or (bgcolor is not None and bgcolor.triplet is None)
        or bool(style.dim and color is not None)
    )


class SkipTruecolor(LineFilter):
    """Wraps one ANSIToTruecolor; Strip caches filtered lines by filter, so one wrapper per filter."""

    def __init__(self, inner: ANSIToTruecolor):
        super().__init__(enabled=inner.enabled)
        self.inner = inner
        self._changes: dict[Style, bool] = {}

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        known, out = self._changes, None
        for i, (text, style, _) in enumerate(segments):
            if style is None:
                continue
            change = known.get(style)
            if change is None:
                if len(known) > 65536:  # styles come and go with the theme: keep the memo bounded
                    known.clear()
                change = known[style] = changes(style)
            if change:
                if out is None:
                    out = list(segments)
                out[i] = Segment(text, self.inner.truecolor_style(style, background.rich_color))
        return segments if out is None else out


def skipping(filters: list[LineFilter], wrappers: dict[int, SkipTruecolor]) -> list[LineFilter]:
    """`filters` with each ANSIToTruecolor wrapped (the same wrapper each time for the same filter)."""
    out: list[LineFilter] = []
    for f in filters:
        if type(f) is ANSIToTruecolor:
            wrapper = wrappers.get(id(f))
            if wrapper is None or wrapper.inner is not f:  # a theme change replaces Textual's filter
                wrappers.clear()
                wrapper = wrappers[id(f)] = SkipTruecolor(f)
            f = wrapper
        out.append(f)
    return out
