"""A pane drawn by lines repaints only the lines that changed, and what stays on screen is what a
full repaint would show (no stale line), through steps, window jumps and a theme change."""

import statistics

from apptools import PROMPT, make_app, settle, wait_for
from rich.segment import Segment
from textual.app import App
from textual.geometry import Region
from textual.strip import Strip

from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.base import LinesPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.panes.tokens import TokensPane


class OnePane(App):
    def compose(self):
        yield LinesPane()


def lines_of(*texts: str) -> list[Strip]:
    return [Strip([Segment(t)]) for t in texts]


async def test_show_lines_repaints_only_the_lines_that_changed():
    app = OnePane()
    async with app.run_test(size=(30, 8)) as pilot:
        pane = app.query_one(LinesPane)
        pane.show_lines(lines_of("a", "b", "c"))
        await pilot.pause()
        repainted: list[Region] = []
        original = pane.refresh
        pane.refresh = lambda *regions, **kw: (repainted.extend(regions), original(*regions, **kw))[1]
        pane.show_lines(lines_of("a", "B", "c"))
        assert [r.y for r in repainted] == [1]
        repainted.clear()
        pane.show_lines(lines_of("a", "B"))  # a line gone is repainted blank
        assert [r.y for r in repainted] == [2]
        await pilot.pause()
        assert [pane.render_line(y).text.strip() for y in range(3)] == ["a", "B", ""]


def on_screen(pane) -> list[Strip]:
    return pane.render_lines(Region(0, 0, *pane.outer_size))


async def full_repaint(pane, pilot) -> list[Strip]:
    pane._styles_cache.clear()
    pane.refresh()
    await pilot.pause()
    return on_screen(pane)


async def test_a_step_at_the_newest_token_repaints_a_few_attention_lines_and_the_screen_stays_true():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60), prompt=PROMPT * 6, context=512)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        pane = app.query_one(AttentionPane)
        repainted: list[int] = []
        original = pane.refresh

        def counted(*regions, **kw):
            repainted.append(sum(r.height for r in regions) if regions else pane.outer_size.height)
            return original(*regions, **kw)

        pane.refresh = counted
        per_step = []
        for _ in range(6):  # at rest the map is full, the newest row last: a step moves every row up
            repainted.clear()
            await pilot.press("space")
            await settle(app, pilot)
            per_step.append(sum(repainted))
            shown = on_screen(pane)
            assert shown == await full_repaint(pane, pilot)
        assert max(per_step) <= pane.size.height  # the pane's lines at most, however long the journey
        per_frame = []  # autoplay pages the window: a step draws its own row's line and the cursor's
        await pilot.press("minus", "minus", "minus", "a")  # a step every 0.5 s: a frame each
        for _ in range(10):
            steps = len(app.journey.snapshot.chips)
            repainted.clear()
            # (the frame of the new step drawn: its pane's lines are on screen)
            await wait_for(lambda steps=steps: len(app.journey.snapshot_drawn.chips) > steps, pilot)
            per_frame.append(sum(repainted))
        await pilot.press("a")
        assert statistics.median(per_frame) <= 8 < pane.size.height, per_frame
        app.theme = "tokenviz-light"
        await pilot.pause(0.2)
        for kind in (AttentionPane, TokensPane, NextTokenPane, SamplingPane):
            widget = app.query_one(kind)
            assert on_screen(widget) == await full_repaint(widget, pilot)


def test_text_becomes_lines_cut_or_wrapped_with_the_panes_style_under_every_span():
    from rich.console import Console
    from rich.style import Style
    from rich.text import Text

    from tokenviz.ui.panes.base import text_strips

    pane = Style(color="#ffffff", bgcolor="#000000")
    cut = text_strips(Text.assemble(("bold", "bold"), " and plain text", no_wrap=True), 10, Console(), pane)
    assert [s.text for s in cut] == ["bold and p"]
    assert [str(seg.style) for seg in cut[0]] == ["bold #ffffff on #000000", "#ffffff on #000000"]
    wrapped = text_strips(Text("one two three four"), 9, Console(), pane)
    assert [s.text.rstrip() for s in wrapped] == ["one two", "three", "four"]
    assert all(seg.style == pane for line in wrapped for seg in line)  # a line without spans is styled too
    assert all(s.cell_length <= 9 for s in wrapped)
