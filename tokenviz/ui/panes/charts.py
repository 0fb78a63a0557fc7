"""Charts pane: the journey over its steps where a person would rather look than read.

Entropy and the chosen token's probability at every step, the watched tokens' probability, the
prompt's surprisal, decode time against context length and the KV cache's size against tokens, each a
plotext chart (textual-plotext). Long series are thinned to at most MAX_POINTS, evenly, so a chart
costs what it shows, not the journey's length.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.containers import Grid
from textual_plotext import PlotextPlot

from tokenviz.ui.panes.base import Pane
from tokenviz.ui.selection import Selection

MAX_POINTS = 240
CHARTS = ("entropy", "watched", "surprisal", "decode", "cache")


def thinned(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most MAX_POINTS of the points, evenly spaced, the last always kept."""
    step = max(1, -(-len(xs) // MAX_POINTS))
    keep = list(range(len(xs) - 1, -1, -step))[::-1]
    return [xs[i] for i in keep], [ys[i] for i in keep]


def rgb(color: str) -> tuple[int, int, int]:
    """A theme's hex colour for plotext."""
    h = color.lstrip("#")
    return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)) if len(h) >= 6 else (128, 128, 128)


class ChartsPane(Pane, Grid):
    DEFAULT_CSS = """
    ChartsPane { grid-size: 3 2; border: round $foreground 30%; border-title-color: $primary; }
    ChartsPane > PlotextPlot { height: 100%; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.series: dict[str, list[tuple[str, list[float], list[float]]]] = {}  # what each chart shows

    def compose(self):
        for name in CHARTS:
            yield PlotextPlot(id=f"chart-{name}")

    def on_mount(self) -> None:
        self.border_title = "charts"

    def draw(self, selection: Selection) -> None:
        s = selection.snapshot
        records = s.records
        steps = [float(r.index) for r in records]
        decoded = records[1:]
        predictions = records[0].prompt_predictions if records else ()
        self.series = {
            "entropy": [
                ("entropy bits", steps, [r.entropy for r in records]),
                ("p chosen", steps, [r.decision.chosen_prob for r in records]),
            ],
            "watched": [
                (text, steps, [next((p.prob for p in r.decision.pinned if p.id == token), 0.0) for r in records])
                for token, text in s.pinned
            ],
            "surprisal": [("bits", [float(p.position + 1) for p in predictions], [p.surprisal for p in predictions])],
            "decode": [("forward ms", [float(r.kv_len) for r in decoded], [r.forward_ms for r in decoded])],
            "cache": [("KV MB", [float(r.kv_len) for r in records], [r.kv_bytes / 2**20 for r in records])],
        }
        titles = {
            "entropy": "entropy and p(chosen) by step",
            "watched": "watched tokens: raw p by step" if s.pinned else "no token watched (w)",
            "surprisal": "the prompt's surprisal by position",
            "decode": "decode ms against context",
            "cache": "KV cache MB against tokens",
        }
        colors = [
            rgb(self.theme_colors.bar),
            rgb(self.theme_colors.bar_final),
            rgb(self.theme_colors.chosen),
            rgb(self.theme_colors.chip_cursor),
        ]
        for name in CHARTS:
            widget = self.query_one(f"#chart-{name}", PlotextPlot)
            plt = widget.plt
            plt.clear_data()
            plt.clear_figure()
            plt.title(titles[name])
            for i, (label, xs, ys) in enumerate(self.series[name]):
                if xs:
                    plt.plot(*thinned(xs, ys), label=label, color=colors[i % len(colors)], marker="braille")
            widget.refresh()
