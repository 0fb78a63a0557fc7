"""Attention pane: the causal attention matrix of one layer as a half-block heatmap.

A Line API widget: the strips are built once per (snapshot, layer, head, cursor, size, theme) and
render_line only hands them out. Long sequences are windowed around the cursor, so drawing cost
stays bounded by the pane's size, not the sequence's length. The weights are the worker's: it
computes the rows this pane shows (see rows_shown) and every snapshot carries them.
"""

from __future__ import annotations

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from tokenviz.contract.attention import head_label, window
from tokenviz.render.colors import ramp
from tokenviz.render.heatmap import heatmap_lines, legend
from tokenviz.render.pieces import visible
from tokenviz.ui.panes.base import Pane
from tokenviz.ui.selection import Selection

LABEL = 14  # columns for the row labels: the cursor mark, the position, the tokens of the row


class AttentionPane(Pane, Widget):
    DEFAULT_CSS = (
        "AttentionPane { border: round $foreground 30%; border-title-color: $primary; "
        "border-subtitle-color: $foreground; }"
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._key: tuple[object, ...] | None = None
        self._strips: list[Strip] = []

    def on_mount(self) -> None:
        self.border_title = "attention"

    def draw(self, selection: Selection) -> None:
        info = selection.snapshot.info
        if info is not None:
            self.border_title = (
                f"attention · layer {selection.layer + 1}/{info.layers} · "
                f"{head_label(selection.head, info.heads, info.kv_heads)}"
            )
        self.refresh()

    class Resized(Message):
        """The pane can show more rows or fewer now: the app asks the worker again."""

    def on_resize(self) -> None:
        self.post_message(self.Resized())

    def rows_shown(self) -> int:
        """How many query rows the map can show at this size (two per terminal row)."""
        return max(self.size.height - 3, 1) * 2

    def render_line(self, y: int) -> Strip:
        self._build()
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width, self.rich_style)

    def _build(self) -> None:
        selection, width, height = self.selection, self.size.width, self.size.height
        theme = self.app.current_theme.name if self.app.current_theme else ""
        identity = (
            None if selection is None else (selection.snapshot.seq, selection.layer, selection.head, selection.cursor)
        )
        key = (identity, width, height, theme, self.app.no_color)
        if key == self._key:
            return
        self._key = key
        if selection is None or selection.positions == 0 or height < 3 or width < LABEL + 4:
            self._strips = [Strip([Segment("waiting for the model…", Style(dim=True))])]
            return
        colors = ramp(list(self.colors.heatmap_stops), 64)
        masked = self.colors.heatmap_masked
        s = selection.snapshot
        n = selection.positions
        cursor = min(selection.cursor, n - 1)
        map_rows = max(height - 3, 1)  # terminal rows for the map; two query rows each
        # A short sequence gets bigger square cells (zoom) so it stays readable.
        zoom_x = max(1, min(3, (width - LABEL) // n))
        zoom = max(1, min(zoom_x, (map_rows * 2) // n))  # rows: as much as fits, never more than x
        queries = window(cursor, n, map_rows * 2 // zoom)
        key_cols = min((width - LABEL) // zoom_x, n)
        keys = range(max(0, queries.stop - key_cols), max(0, queries.stop - key_cols) + key_cols)
        view = s.attention
        if view is None or not view.covers(selection.layer, queries):
            if not self._strips or self._strips[0].text.startswith("waiting"):
                self._strips = [Strip([Segment("computing attention…", Style(dim=True))])]
            return  # the rows asked for are on their way: keep the last map until they come
        matrix = view.window(queries, keys, selection.head)
        matrix = np.repeat(np.repeat(matrix, zoom, axis=0), zoom_x, axis=1)
        strips = []
        cursor_style = Style(color=self.colors.chip_cursor, bold=True)
        dim = Style(dim=True)
        shades = self.app.no_color
        chips = s.chips
        labelled = -1
        map_lines: list[list[Segment]] = []
        for r, segments in enumerate(heatmap_lines(matrix, colors, masked, shades=shades)):
            upper, lower = queries.start + (2 * r) // zoom, queries.start + (2 * r + 1) // zoom
            lower = min(lower, queries.stop - 1)
            has_cursor = cursor in (upper, lower)
            new = [q for q in (upper, lower) if q > labelled]  # a zoomed row is labelled once
            labelled = max(labelled, upper, lower)
            label = row_label(new, chips, has_cursor)
            map_lines.append([Segment(label, cursor_style if has_cursor else dim), *segments])
        strips.append(Strip([Segment(" " * LABEL), Segment(key_axis(keys, chips, zoom_x), dim)]))
        strips.append(
            Strip(
                [
                    Segment(" " * LABEL),
                    Segment(f"keys {keys.start}–{keys.stop - 1} (each key's first letters above)", dim),
                    Segment(f" · queries {queries.start}–{queries.stop - 1} of {n}", dim),
                ]
            )
        )
        row = np.nan_to_num(view.row(cursor, selection.head), nan=-1.0)
        top = np.argsort(-row, kind="stable")[:4]
        focus = "  ".join(f"{visible(chips[k].text)} {row[k]:.2f}" for k in top.tolist())
        if view.missing:
            focus = view.missing
        # The max over heads is no distribution (its row sums past 1): it is not called attention weights.
        reads = "largest weight any head gives" if selection.head == "max" else "attends to"
        strips.append(
            Strip([Segment(f"{visible(chips[cursor].text)}@{cursor} {reads}: ", cursor_style), Segment(focus)])
        )
        scale = legend(colors, min(24, width - 12), shades=shades)
        strips.append(Strip([Segment("0 "), *scale, Segment(" 1  (√ scale)", dim)]))
        style = self.rich_style  # computed from the CSS on each access: once here, not once per line
        # The map's cells set both their colours; the pane's style goes under the labels and text only.
        self._strips = [
            Strip(line).crop(0, width).apply_style(style)
            if shades
            else Strip([Segment(line[0].text, style + line[0].style), *line[1:]]).crop(0, width)
            for line in map_lines
        ] + [strip.crop(0, width).apply_style(style) for strip in strips]


def row_label(queries: list[int], chips, cursor: bool) -> str:
    """`▶  12 The/·E`: the cursor mark, the first position and the tokens of one terminal row."""
    if not queries:
        return " " * LABEL
    pieces = "/".join(visible(chips[q].text) for q in queries)
    head = f"{'▶' if cursor else ' '}{queries[0]:>4} "
    return f"{head}{pieces[: LABEL - len(head) - 1]:<{LABEL - len(head) - 1}} "


def key_axis(keys: range, chips, zoom_x: int) -> str:
    """Under each key column, the first letters of its token (as many as the column is wide)."""
    return "".join(f"{visible(chips[k].text).lstrip('·') or '·':<{zoom_x}.{zoom_x}}" for k in keys)
