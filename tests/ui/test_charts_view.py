"""The charts view plots the journey's own figures: entropy and the chosen token's probability by
step, the watched tokens, the prompt's surprisal, decode time and the KV cache; long series are
thinned to what a chart can show, the newest point always kept."""

import itertools
import math

import pytest
from apptools import make_app, settle, wait_for
from hypothesis import given
from hypothesis import strategies as st

from tokenviz.contract.commands import Watch
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.charts import MAX_POINTS, thinned


def rows_of(chart) -> list[str]:
    """The lines a chart draws, as text."""
    return ["".join(seg.text for seg in line) for line in chart.render_lines(chart.region.reset_offset)]


async def open_charts(app, pilot, steps: int) -> None:
    """The charts view, after `steps` steps, drawn (its shown charts' axes on screen)."""
    await settle(app, pilot)
    await pilot.press(*["space"] * steps, "C")
    await settle(app, pilot)
    plots = app.query_one("#charts").query("PlotextPlot")
    await wait_for(lambda: any("┤" in "".join(rows_of(plot)) for plot in plots if plot.display), pilot)


async def test_c_charts_the_journeys_own_figures():
    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=40))
    async with app.run_test(size=(160, 44)) as pilot:
        await settle(app, pilot)
        app.journey.submit(Watch(42))
        await pilot.press(*["space"] * 6, "C")
        s = await settle(app, pilot)
        assert app.query_one("#views").current == "charts"
        series = app.query_one("#charts").series
        records = s.records
        (_, steps, entropy), (_, _, chosen) = series["entropy"]
        assert steps == [float(r.index) for r in records] and entropy == [r.entropy for r in records]
        assert chosen == [r.decision.final_prob for r in records]
        ((label, _, watched),) = series["watched"]
        assert label == s.pinned[0][1] and watched == [r.decision.pinned[0].prob for r in records]
        ((_, positions, bits),) = series["surprisal"]
        predictions = records[0].prompt_predictions
        assert positions == [float(p.position + 1) for p in predictions] and bits == [p.surprisal for p in predictions]
        ((_, context, ms),) = series["decode"]
        assert context == [float(r.kv_len) for r in records[1:]] and ms == [r.forward_ms for r in records[1:]]
        ((_, tokens, mb),) = series["cache"]
        assert tokens == [float(r.kv_len) for r in records] and mb == [r.kv_bytes / 2**20 for r in records]
        await pilot.press("C")  # again: back to the attention map
        await settle(app, pilot)
        assert app.query_one("#views").current == "attention"


def test_long_series_are_thinned_evenly_keeping_the_newest():
    xs = [float(i) for i in range(10_000)]
    tx, ty = thinned(xs, [x * 2 for x in xs])
    assert len(tx) <= MAX_POINTS and tx[-1] == 9999.0 and ty == [x * 2 for x in tx]
    assert thinned([1.0, 2.0], [3.0, 4.0]) == ([1.0, 2.0], [3.0, 4.0])


def test_integer_axes_get_whole_number_ticks():
    from tokenviz.ui.panes.charts import integer_ticks

    assert integer_ticks(0, 17, 5) == [0, 5, 10, 15]
    assert integer_ticks(3, 4, 8) == [3, 4]
    assert all(isinstance(t, int) for t in integer_ticks(0, 2265, 6))


async def test_a_small_pane_shows_one_chart_at_a_time_and_the_arrows_change_it():
    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=40))
    async with app.run_test(size=(80, 24)) as pilot:
        await open_charts(app, pilot, steps=4)
        charts = app.query_one("#charts")
        assert charts.one_at_a_time and charts.has_class("-one")
        shown = [plot.id for plot in charts.query("PlotextPlot") if plot.display]
        assert shown == ["chart-entropy"]
        assert str(charts.border_title).startswith("charts · 1/6")
        cursor = app.journey.cursor
        await pilot.press("right")  # the arrows change the chart, not the token cursor
        await pilot.pause(0.2)
        assert [plot.id for plot in charts.query("PlotextPlot") if plot.display] == ["chart-watched"]
        assert str(charts.border_title).startswith("charts · 2/6") and app.journey.cursor == cursor
        await pilot.resize_terminal(200, 60)
        await pilot.pause(0.5)
        assert not charts.one_at_a_time and len([p for p in charts.query("PlotextPlot") if p.display]) == 6


async def test_at_80x24_every_chart_keeps_a_title_and_says_which_colour_is_which_line():
    """Issue 51, item 11: at 80x24 charts 1, 3 and 4 lost their titles (plotext drops one wider than the
    chart) and no chart said which colour is which line. Each draws the fullest title that fits, and
    the pane's subtitle keys the shown chart's lines in their colours."""
    from textual_plotext import PlotextPlot

    from tokenviz.ui.panes.charts import CHARTS, ChartsPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        app.journey.submit(Watch(42))
        await pilot.press(*["space"] * 6, "C")
        await settle(app, pilot)
        pane = app.query_one(ChartsPane)
        theme = pane.theme_colors
        for _ in CHARTS:
            await pilot.pause(0.3)
            chart = next(c for c in pane.query(PlotextPlot) if c.has_class("-shown"))
            first = "".join(seg.text for seg in chart.render_lines(chart.region.reset_offset)[0]).strip()
            assert first and not first.startswith(("┌", "│")), first  # a title row, above the frame
            key = str(pane.border_subtitle)
            for i, (label, _xs, _) in enumerate(pane.series[CHARTS[pane.shown]]):
                color = (theme.bar, theme.bar_final, theme.chosen, theme.chip_cursor)[i % 4]
                assert f"[{color}]━━ {label}" in key, key
            await pilot.press("right")


@given(st.floats(1e-6, 1e6), st.integers(2, 20))
def test_value_axes_get_round_evenly_stepped_ticks_every_one_labelled(high, most):
    """Issue 69, finding 23: plotext's own ticks skipped the middle label (4.82 4.02 3.21 · 1.61 0.80)."""
    from tokenviz.ui.panes.charts import value_ticks

    ticks, labels = value_ticks(high, most)
    assert 2 <= len(ticks) <= most and ticks[0] == 0 and ticks[-1] <= high * (1 + 1e-9)
    step = ticks[1]
    assert ticks[-1] + step > high * (1 - 1e-9)  # the top tick is the last one under the axis's top
    assert all(abs(b - a - step) <= step * 1e-9 for a, b in itertools.pairwise(ticks))
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-12)
    assert any(abs(mantissa - m) < 1e-6 for m in (1, 2, 2.5, 5)), step
    assert len({len(label.split(".")[-1]) for label in labels if "." in label}) <= 1
    assert [float(label) for label in labels] == pytest.approx(ticks, abs=step * 1e-6)


async def test_a_charts_value_axis_labels_every_tick():
    from textual_plotext import PlotextPlot

    from tokenviz.ui.panes.charts import ChartsPane, value_ticks

    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=30))
    async with app.run_test(size=(80, 24)) as pilot:
        await open_charts(app, pilot, steps=6)
        pane = app.query_one(ChartsPane)
        chart = next(c for c in pane.query(PlotextPlot) if c.has_class("-shown"))
        rows = rows_of(chart)
        ((_, _, entropy), _) = pane.series["entropy"]
        _, labels = value_ticks(max(entropy), max(chart.size.height // 3, 2))
        left = [row.split("┤")[0].strip() for row in rows if "┤" in row]
        assert [label for label in left if label] == labels[::-1], rows


def test_a_watched_tokens_name_in_the_key_is_printable_and_one_line():
    from tokenviz.render.visible import visible

    assert visible("\n", spaces=False) == "↵" and visible(" the\t", spaces=False) == " the⇥"
    assert "\x1b" not in visible("\x1b[31m", spaces=False)


async def test_a_line_at_zero_is_drawn_on_the_zero_gridline_not_below_it():
    """UX 7's finding 22: the entropy chart's line dipped below the 0 gridline: a value of 0 was drawn in the
    cell's lowest dots, under the tick's mark at the cell's middle. At every size a chart is seen, a line at
    0 is drawn in the middle dots of the row the 0 labels, none in its lowest alone."""
    from textual_plotext import PlotextPlot

    from tokenviz.ui.panes.charts import ChartsPane

    middle, lowest = 0x02 | 0x04 | 0x10 | 0x20, 0x40 | 0x80  # braille's dots by their row in the cell
    for size in ((80, 24), (120, 36), (200, 60)):
        app = make_app(SamplingSettings(temperature=1.0, max_new_tokens=30))
        async with app.run_test(size=size) as pilot:
            await open_charts(app, pilot, steps=3)
            pane = app.query_one(ChartsPane)
            chart = next(c for c in pane.query(PlotextPlot) if c.has_class("-shown"))
            steps = [float(x) for x in range(12)]
            series = [("entropy bits", steps, [0.0, 0.0, 3.0, 0.0, 0.0, 5.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])]
            pane._plot(chart, "entropy", series, [(200, 200, 200)], "entropy")
            await pilot.pause()
            rows = [row for row in rows_of(chart) if "┤" in row or "│" in row[:8]]
            zero = next(row for row in rows if row.split("┤")[0].strip() in ("0", "0.0"))
            dots = [ord(c) - 0x2800 for c in zero.split("┤", 1)[1] if 0x2801 <= ord(c) <= 0x28FF]
            assert sum(d & middle == d for d in dots) >= len(dots) // 2, (size, zero)  # flat, at the mark's height
            assert not any(d & lowest and not d & middle for d in dots), (size, zero)  # none under it
