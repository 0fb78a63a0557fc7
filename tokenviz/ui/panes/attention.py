"""Attention pane: the causal attention matrix of one layer as a half-block heatmap.

A Line API pane (LinesPane): each map line is kept, by what it shows, between frames, and only
lines that changed are repainted. The window of rows and of key columns moves by half-windows
(contract.attention.window), so while a journey grows the lines already shown stay put and a step
redraws the newest row's line and the cursor's. Long sequences are windowed around the cursor, so
drawing cost stays bounded by the pane's size, not the sequence's length. The weights are the
worker's: it computes the rows this pane shows (see rows_shown) and every snapshot carries them.
"""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.message import Message
from textual.strip import Strip

from tokenviz.contract.attention import HEAD_MODES, Head, head_label, paged_start, window
from tokenviz.contract.commands import Intervene
from tokenviz.contract.engine import Capability, refusal_of
from tokenviz.contract.interventions import HeadAblation
from tokenviz.contract.records import TokenChip
from tokenviz.render.colors import ramp
from tokenviz.render.columns import cell, fitting
from tokenviz.render.heatmap import legend, pair_codes, run_segments, shade_lines
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import LinesPane
from tokenviz.ui.selection import Selection

LABEL = 14  # columns for the row labels: the cursor mark, the position, the tokens of the row
LEVELS = 64  # colours on the heatmap's scale
UNDER_MAP = ("axis", "range", "focus", "legend")  # the lines under the map, in their order
KEPT_FIRST = ("legend", "focus", "axis", "range")  # on a short pane, the ones that stay
MIN_MAP_ROWS = 2
COMING = ("↓ the next tokens' rows come here", "↓ next rows here", "")  # under the newest row, while there is room


def layout(height: int) -> tuple[int, tuple[str, ...]]:
    """(terminal rows for the map, the lines under it) in a pane `height` rows high: the colour
    legend and the cursor's row stay longest."""
    under = min(len(UNDER_MAP), max(height - MIN_MAP_ROWS, 1))
    kept = set(KEPT_FIRST[:under])
    return max(height - under, 1), tuple(line for line in UNDER_MAP if line in kept)


class AttentionPane(LinesPane):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._map_lines: dict[tuple[object, ...], Strip] = {}  # by what a map line shows, kept a frame
        self._drawn_for: tuple[object, ...] | None = None  # the look the kept map lines were drawn for
        self.layer_chosen = False  # the user chose a layer: a new model keeps it, not its last layer

    def on_mount(self) -> None:
        self.set_title("attention")

    # ---- its keys (routed here by the journey's screen: see ui.keys.Press.owner) ----------------------

    def action_layer(self, delta: int) -> None:
        journey = self.journey
        if journey.snapshot and journey.snapshot.info:
            self._in_view()
            self.layer_chosen = True
            journey.model_layer = (journey.model_layer + delta) % journey.snapshot.info.layers

    def action_head(self, delta: int) -> None:
        journey = self.journey
        if not (journey.snapshot and journey.snapshot.info):
            return
        self._in_view()
        cycle: list[Head] = [*HEAD_MODES, *range(journey.snapshot.info.heads)]
        journey.head = cycle[(cycle.index(journey.head) + delta) % len(cycle)]

    def action_ablate_head(self) -> None:
        """Zero-ablate the head the map shows, or restore it where it is ablated so."""
        journey = self.journey
        s = journey.snapshot
        if s is None or s.info is None:
            return
        if not isinstance(journey.head, int):
            self.notify(
                "the attention map shows a head's mean or max: choose one head with h first", severity="warning"
            )
            return
        ablation = HeadAblation(layer=min(journey.model_layer, s.info.layers - 1), head=journey.head)
        kept = tuple(entry for entry in s.interventions if entry[0] != ablation)
        journey.submit(Intervene(kept if len(kept) < len(s.interventions) else (*kept, (ablation, True))))

    def _in_view(self) -> None:
        """The map back in its place, where another view had it: the layer and head keys change what it
        shows, which must not happen unseen."""
        if self.journey.current_view != "attention":
            self.journey.open_view("attention")

    def draw(self, selection: Selection) -> None:
        info = selection.info
        line = refusal_of(info, Capability.ATTENTION, "the attention map") if info is not None else None
        if line is not None:  # (a served model): said in the pane, where the map would be
            self.set_title("attention")
            self.show_lines(
                [Strip([Segment(part, Style(dim=True))]) for part in textwrap.wrap(line, max(self.size.width, 20))]
            )
            return
        if info is not None:
            head = head_label(selection.head, info.heads, info.kv_heads)
            layer = f"{selection.layer} of {info.layers}"  # from 0: one numbering for layers, heads and positions
            # The map shown is the last one while the rows of the journey as it is now are computed.
            now = "computing… · " if selection.snapshot.computing == "attention" else ""
            self.set_title(
                f"attention · {now}layer {layer} · {head}", f"attn · {now}L{layer} · {head}", f"{now}L{layer} · {head}"
            )
        self.show_lines(self._build(selection))

    class Resized(Message):
        """The pane can show more rows or fewer now: the app asks the worker again."""

    def on_resize(self) -> None:
        super().on_resize()
        self.post_message(self.Resized())

    def rows_shown(self) -> int:
        """How many query rows the map can show at this size (two per terminal row)."""
        return layout(self.size.height)[0] * 2

    def redraw(self) -> list[Strip]:
        return self._strips if self.selection is None else self._build(self.selection)

    def _build(self, selection: Selection) -> list[Strip]:
        look = self.look()
        if look != self._drawn_for:
            self._drawn_for, self._map_lines = look, {}
        width, height = self.size.width, self.size.height
        if selection.positions == 0 or height < 3 or width < LABEL + 4:
            return [Strip([Segment("waiting for the model…", Style(dim=True))])]
        s = selection.snapshot
        n = selection.positions
        cursor = min(selection.cursor, n - 1)
        map_rows, under = layout(height)  # terminal rows for the map (two query rows each), lines under it
        # A short sequence gets bigger square cells (zoom) so it stays readable.
        zoom_x = max(1, min(3, (width - LABEL) // n))
        zoom = max(1, min(zoom_x, (map_rows * 2) // n))  # rows: as much as fits, never more than x
        queries = window(cursor, n, map_rows * 2 // zoom, paged=s.playing)
        key_cols = (width - LABEL) // zoom_x  # past the newest token: the masked future, filled in as it comes
        start = paged_start(queries.stop - 1, key_cols) if n > key_cols else 0
        if cursor < n - 1 or not s.playing:
            start = max(min(start, queries.stop - key_cols), 0)  # as window: full unless autoplay follows
        if key_cols >= len(queries):
            start = min(start, queries.start)  # every row shown keeps its own diagonal in view
        keys = range(start, start + key_cols)
        view = s.attention
        if view is None or not view.covers(selection.layer, queries):
            if not self._strips or self._strips[0].text.startswith("waiting"):
                return [Strip([Segment("computing attention…", Style(dim=True))])]
            return self._strips  # the rows asked for are on their way: keep the last map until they come
        if view.missing and s.live and view.failed:  # rows the engine could not give: why, in words
            return [Strip([Segment(line, Style(dim=True))]) for line in textwrap.wrap(view.missing, max(width, 20))]
        matrix = view.window(queries, keys, selection.head)
        matrix = np.repeat(np.repeat(matrix, zoom, axis=0), zoom_x, axis=1)
        style = self.rich_style  # computed from the CSS on each access: once here, not once per line
        cursor_style = Style(color=self.theme_colors.chip_cursor, bold=True)
        dim = Style(dim=True)
        chips = s.chips
        colors = heat_colors(self.theme_colors.heatmap_stops)
        lines = self._map(matrix, queries, zoom, cursor, chips, style, colors)
        if len(lines) < map_rows:  # following the newest: the rows stay put and the next ones come below
            note = fitting(COMING, width - LABEL)
            room = Strip([Segment(" " * LABEL, style), Segment(note, style + dim)]).extend_cell_length(width, style)
            lines += [room] + [Strip.blank(width, style)] * (map_rows - len(lines) - 1)
        trailer = {
            "axis": Strip([Segment(" " * LABEL), Segment(key_axis(keys, chips, zoom_x), dim)]),
            "range": Strip(
                [
                    Segment(" " * LABEL),
                    Segment(
                        fitting(
                            (
                                f"keys {keys.start}–{min(keys.stop, n) - 1} (each key's first letters above)"
                                f" · queries {queries.start}–{queries.stop - 1} of {n}",
                                f"keys {keys.start}–{min(keys.stop, n) - 1} · queries {queries.start}–"
                                f"{queries.stop - 1} of {n}",
                                f"keys {keys.start}–{min(keys.stop, n) - 1} of {n}",
                            ),
                            width - LABEL,
                        ),
                        dim,
                    ),
                ]
            ),
        }
        row = np.nan_to_num(view.row(cursor, selection.head), nan=-1.0)
        top = np.argpartition(-row, min(3, len(row) - 1))[:4]
        top = top[np.lexsort((top, -row[top]))]  # strongest first, ties by position
        # The max over heads is no distribution (its row sums past 1): it is not called attention weights.
        reads = "largest weight any head gives" if selection.head == "max" else "attends to"
        lead = f"{visible(chips[cursor].text)}@{cursor} {reads}: "
        items = [f"{visible(chips[k].text)} {row[k]:.2f}" for k in top.tolist()]
        # As many of the strongest keys as fit whole: a narrow pane shows fewer, never a cut number.
        focus = view.missing or fitting(
            ["  ".join(items[:k]) for k in range(len(items), 0, -1)], width - cell_len(lead)
        )
        trailer["focus"] = Strip([Segment(lead, cursor_style), Segment(focus)])
        shades = self.app.no_color
        scale = legend(colors, min(24, width - 16), shades=shades)
        trailer["legend"] = Strip([Segment("0 "), *scale, Segment(" 1  (√ scale)", dim)])
        return lines + [trailer[name].crop(0, width).apply_style(style) for name in under]

    def _map(
        self,
        matrix: np.ndarray,
        queries: range,
        zoom: int,
        cursor: int,
        chips: Sequence[TokenChip],
        style: Style,
        colors: list[str],
    ) -> list[Strip]:
        """The map's lines, each labelled with its rows; a line that shows what it showed in the
        last frame is the same Strip (and so is not repainted)."""
        width, shades, masked = self.size.width, self.app.no_color, self.theme_colors.heatmap_masked
        cursor_style = Style(color=self.theme_colors.chip_cursor, bold=True)
        dim = Style(dim=True)
        codes = shade_lines(matrix) if shades else pair_codes(matrix, LEVELS)
        kept, lines, labelled = self._map_lines, [], -1
        self._map_lines = {}
        for r, row in enumerate(codes):
            upper, lower = queries.start + (2 * r) // zoom, queries.start + (2 * r + 1) // zoom
            lower = min(lower, queries.stop - 1)
            has_cursor = cursor in (upper, lower)
            new = [q for q in dict.fromkeys((upper, lower)) if q > labelled]  # a row is labelled once
            labelled = max(labelled, upper, lower)
            label = row_label([cursor] if has_cursor and cursor in new else new, chips, has_cursor)
            # The map's cells set both their colours; the pane's style goes under the label only.
            key = (label, has_cursor, row[0].text if shades else row.tobytes())
            line = kept.get(key)
            if line is None:
                head = Segment(label, style + (cursor_style if has_cursor else dim))
                if shades:
                    line = Strip([head, *row]).crop(0, width).apply_style(style)
                else:
                    line = Strip([head, *run_segments(row, colors, masked)]).crop(0, width)
            self._map_lines[key] = line
            lines.append(line)
        return lines


@functools.lru_cache(maxsize=8)
def heat_colors(stops: tuple[str, ...]) -> list[str]:
    """A theme's heatmap scale, made once."""
    return ramp(list(stops), LEVELS)


def row_label(queries: list[int], chips: Sequence[TokenChip], cursor: bool) -> str:
    """`  12 The/·E`: the first position and the tokens of one terminal row (its two query rows); the
    cursor's row, `▶  13 ·E`: the cursor's own position and token, not its neighbour's."""
    if not queries:
        return " " * LABEL
    pieces = "/".join(visible(chips[q].text) for q in queries)
    head = f"{'▶' if cursor else ' '}{queries[0]:>4} "
    return f"{head}{cell(pieces, LABEL - len(head) - 1)} "


def key_axis(keys: range, chips: Sequence[TokenChip], zoom_x: int) -> str:
    """Under each key column, the first letters of its token (as many as the column is wide); a
    column past the newest token is blank."""
    return "".join(
        f"{visible(chips[k].text).lstrip('·') or '·':<{zoom_x}.{zoom_x}}" if k < len(chips) else " " * zoom_x
        for k in keys
    )
