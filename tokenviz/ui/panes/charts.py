"""Charts pane: the journey over its steps where a person would rather look than read.

Entropy and the chosen token's probability at every step, the watched tokens' probability, the watched
SAE features' activation, the prompt's surprisal, decode time against context length and the KV cache's
size against tokens, each a plotext chart (textual-plotext). Long series are thinned to at most
MAX_POINTS, evenly, so a chart costs what it shows, not the journey's length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import Grid
from textual.markup import escape
from textual_plotext import PlotextPlot

from tokenviz.contract.text import safe_text
from tokenviz.render.visible import visible
from tokenviz.ui.panes.base import PANE_BORDER, Pane
from tokenviz.ui.selection import Selection

MAX_POINTS = 240
PLOT_FRAME_ROWS = 4  # a chart's rows that are not its plot: its title, frame's top and bottom, the steps' ticks
CHARTS = ("entropy", "watched", "features", "surprisal", "decode", "cache")
Series = list[tuple[str, list[float], list[float]]]  # (label, xs, ys) of each line a chart draws


def thinned(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS of the points, evenly spaced, the last always kept."""
    step = max(1, -(-len(xs) // MAX_POINTS))
    keep = list(range(len(xs) - 1, -1, -step))[::-1]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def rgb(color: str) -> tuple[int, int, int]:
    """A theme's hex colour for plotext."""
    h = color.lstrip("#")
    return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)) if len(h) >= 6 else (128, 128, 128)


def integer_ticks(low: float, high: float, most: int) -> list[int]:
    """At most `most` whole-number ticks from `low` to `high`, evenly stepped (steps, positions and
    tokens are counted, so their axes never read 2.5)."""
    low, high = int(low), int(high)
    step = max(1, -(-(high - low) // max(most - 1, 1)))
    return list(range(low, high + 1, step))


def centred_limits(high: float, rows: int) -> tuple[float, float]:
    """The value axis's limits that put 0 and `high` at the middle of the bottom and top rows, where their
    ticks' marks are: at the rows' edges a line at 0 is drawn in the cell's lowest dots, below the 0
    gridline's mark (UX 7's finding 22)."""
    row = high / max(rows - 1, 1)  # what one row spans
    return -row / 2, high + row / 2


def value_ticks(high: float, most: int) -> tuple[list[float], list[str]]:
    """Ticks from 0 towards `high`, at most `most` of them, a round step apart (1, 2, 2.5 or 5 times a
    power of ten) and every one labelled alike: plotext's own drop a label where two crowd an axis."""
    if high <= 0 or most < 2:
        return [0.0], ["0"]
    least = high / most  # a step over this gives at most `most` ticks
    power = 10.0 ** math.floor(math.log10(least))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power > least)
    decimals = next(d for d in range(16) if abs(round(step, d) - step) <= step * 1e-9)
    ticks = [i * step for i in range(min(most - 1, int(high / step * (1 + 1e-12))) + 1)]
    return ticks, [f"{t:.{decimals}f}" for t in ticks]


class ChartsPane(Pane, Grid):
    """Six charts in a grid on a large terminal; on a smaller one, one at a time, as large as the
    pane, with its title and range (← → change which)."""

    DEFAULT_CSS = f"""
    ChartsPane {{ grid-size: 3 2; border: {PANE_BORDER}; border-title-color: $primary; }}
    ChartsPane > PlotextPlot {{ height: 100%; }}
    ChartsPane.-one {{ grid-size: 1 1; }}
    ChartsPane.-one > PlotextPlot {{ display: none; }}
    ChartsPane.-one > PlotextPlot.-shown {{ display: block; }}
    """
    GRID_SIZE = (120, 30)  # the pane's least columns and rows for all the charts at once (200x60 gives 144x36)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.series: dict[str, list[tuple[str, list[float], list[float]]]] = {}  # what each chart shows
        self.shown = 0  # the chart shown alone on a smaller pane (see turn)

    @property
    def one_at_a_time(self) -> bool:
        return self.size.width < self.GRID_SIZE[0] or self.size.height < self.GRID_SIZE[1]

    def turn(self, delta: int) -> None:
        """Show the next (1) or previous (-1) chart, on a pane that shows one at a time."""
        self.shown = (self.shown + delta) % len(CHARTS)
        if self.selection is not None:
            self.draw(self.selection)

    def compose(self) -> ComposeResult:
        for name in CHARTS:
            yield PlotextPlot(id=f"chart-{name}")

    def on_mount(self) -> None:
        self.set_title("charts")

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        records = s.records
        steps = [float(r.index) for r in records]
        decoded = records[1:]
        predictions = records[0].prompt_predictions if records else ()
        self.series = {
            "entropy": [
                ("entropy bits", steps, [r.entropy for r in records]),
                ("p chosen", steps, [r.decision.final_prob for r in records]),
            ],
            "watched": [
                (text, steps, [next((p.prob for p in r.decision.pinned if p.id == token), 0.0) for r in records])
                for token, text in s.pinned
            ],
            "features": [  # a step is its position's from the last prompt token's on
                (f"{w.sae}#{w.id}", [float(p - s.prompt_len + 1) for p in w.positions], list(w.activations))
                for w in s.watched_features
            ],
            "surprisal": [("bits", [float(p.position + 1) for p in predictions], [p.surprisal for p in predictions])],
            "decode": [("forward ms", [float(r.kv_len) for r in decoded], [r.forward_ms for r in decoded])],
            "cache": [("KV MB", [float(r.kv_len) for r in records], [r.kv_bytes / 2**20 for r in records])],
        }
        titles = {  # the fullest that fits the chart is drawn (plotext drops a title too wide for it)
            "entropy": (
                "entropy (bits, left) and p(chosen) (right) by step",
                "entropy (left), p chosen (right)",
                "entropy, p chosen",
            ),
            "watched": ("watched tokens: raw p by step", "watched: raw p") if s.pinned else ("no token watched (w)",),
            "features": ("watched SAE features: activation by step", "features: activation")
            if s.watched_features
            else ("no feature watched (w feature:SAE:ID)", "no feature watched"),
            "surprisal": ("the prompt's surprisal (bits) by position", "prompt surprisal (bits)", "surprisal"),
            "decode": ("decode ms against context (tokens)", "decode ms by context", "decode ms"),
            "cache": ("KV cache MB against tokens", "KV MB by tokens", "KV MB"),
        }
        hexes = [
            self.theme_colors.bar,
            self.theme_colors.bar_final,
            self.theme_colors.chosen,
            self.theme_colors.chip_cursor,
        ]
        colors = [rgb(h) for h in hexes]
        one = self.one_at_a_time
        self.set_class(one, "-one")
        for index, name in enumerate(CHARTS):
            widget = self.query_one(f"#chart-{name}", PlotextPlot)
            widget.set_class(index == self.shown, "-shown")
            if one and index != self.shown:
                continue
            room = (widget.size.width or self.content_size.width) - 2  # a chart just shown is not laid out yet
            title = next((t for t in titles[name] if cell_len(t) <= room), titles[name][-1])
            self._plot(widget, title, self.series[name], colors, name)
        if one:
            series = self.series[CHARTS[self.shown]]
            at, ranges = f"{self.shown + 1}/{len(CHARTS)}", _ranges(series)
            self.set_title(
                f"charts · {at}: {ranges} · ← → change", f"charts · {at}: {ranges}", f"charts · {at} · ← → change"
            )
            # Which colour is which line: a chart this small has no room for plotext's key.
            key = " ".join(
                # a watched token's text: printable, on one line
                f"[{hexes[i % len(hexes)]}]━━ {escape(visible(safe_text(label), spaces=False))}[/]"
                for i, (label, xs, _) in enumerate(series)
                if xs
            )
            if key != self.border_subtitle:
                self.border_subtitle = key
        else:
            self.set_title("charts")
            self.border_subtitle = ""

    def _plot(
        self, widget: PlotextPlot, title: str, series: Series, colors: Sequence[tuple[int, int, int]], name: str
    ) -> None:
        plt = widget.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        keyed = widget.size.height >= 14  # a short chart leaves its key to the pane's subtitle
        for i, (label, xs, ys) in enumerate(series):
            if not xs:
                continue
            side = "right" if name == "entropy" and i == 1 else "left"  # probability on its own axis
            plt.plot(
                *thinned(xs, ys),
                label=label if keyed else None,
                color=colors[i % len(colors)],
                marker="braille",
                yside=side,
            )
            # From 0: growth at its true size; a probability on 0 to 1. (plotext's hint: yside is "left"/"right")
            high = 1.0 if name == "watched" or side == "right" else (max(ys) or 1.0)
            plt.ylim(*centred_limits(high, widget.size.height - PLOT_FRAME_ROWS), yside=side)  # type: ignore[arg-type]
            plt.yticks(*value_ticks(high, max(widget.size.height // 3, 2)), yside=side)  # type: ignore[arg-type]
        xs_all = [x for _, xs, _ in series for x in xs]
        if xs_all:
            ticks = integer_ticks(min(xs_all), max(xs_all), max(widget.size.width // 10, 2))
            plt.xticks([float(t) for t in ticks], [str(t) for t in ticks])
        widget.refresh()


def _ranges(series: Series) -> str:
    """Each line's name and its smallest and largest value: what the title says of a chart shown alone."""
    parts = [f"{label} {min(ys):.3g}–{max(ys):.3g}" for label, _, ys in series if ys]
    return " · ".join(parts) or "nothing yet"
