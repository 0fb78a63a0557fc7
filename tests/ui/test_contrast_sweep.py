"""Every theme legible on a projector: each cell of text the app renders (the panes, every view, the
footer, each dialog) stands at least 4.5:1 against its own background (WCAG's figure for text), the
dialogs' controls at least 3:1, measured from the cells Textual composes. A modal dialog's backdrop is
the screen behind it, dimmed on purpose: only the dialog itself is read there."""

import pytest
from apptools import make_app, settle, wait_for
from textual.geometry import Region

from tokenviz.contract.settings import SamplingSettings
from tokenviz.render.colors import contrast

THEMES = ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"]
VIEWS = ["", "M", "i", "C", "l", "c", "b", "m", "W", "D", "u"]  # each key opens its view, again closes it
DIALOGS = ["question_mark", "e", "G", "I", "Y"]
TEXT, CONTROL = 4.5, 3.0
SIZE = (120, 36)


def graphic(ch: str) -> bool:
    """A cell drawn, not read: box lines, blocks and bars, braille plots, marks, spaces."""
    return ch.isspace() or 0x2500 <= ord(ch) <= 0x259F or 0x2800 <= ord(ch) <= 0x28FF


def rgb(style, attribute):
    color = getattr(style, attribute)
    return None if color is None else color.get_truecolor()


def shortfalls(app, region: Region | None = None, controls: tuple[Region, ...] = ()) -> list[tuple]:
    """(ratio, text, foreground, background) of each run of text under its figure, 4.5, and of the
    drawn parts of `controls` (an input's frame, a switch's mark) under 3."""
    out = []
    for y, strip in enumerate(app.screen._compositor.render_strips()):
        x = 0
        for segment in strip:
            start, x = x, x + segment.cell_length
            if region is not None and not (region.y <= y < region.bottom and region.x <= start < region.right):
                continue
            style = segment.style
            text = "".join(c for c in segment.text if not graphic(c))
            drawn = any(c.contains(start, y) for c in controls) and any(
                not c.isspace() and graphic(c) for c in segment.text
            )
            if not (text or drawn) or style is None:
                continue
            fg, bg = rgb(style, "color"), rgb(style, "bgcolor")
            assert fg is not None and bg is not None, f"{segment.text!r} has no colour of its own"
            if style.dim:  # (Textual draws dim text half way to its background)
                fg = tuple((f + b) // 2 for f, b in zip(fg, bg))
            ratio = contrast(fg, bg)
            if ratio < (TEXT if text else CONTROL):
                out.append((round(ratio, 2), segment.text.strip()[:20], fg, bg))
    return out


@pytest.mark.parametrize("theme", THEMES)
async def test_every_view_and_dialog_reads_at_4_5_to_1(theme):
    app = make_app(SamplingSettings(temperature=0), theme=theme)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "space")
        await settle(app, pilot)
        for key in VIEWS:
            if key:
                await pilot.press(key)
                await settle(app, pilot)
            await pilot.pause(0.1)
            assert shortfalls(app) == [], (theme, key)
            if key:
                await pilot.press(key)
                await settle(app, pilot)
        for key in DIALOGS:
            await pilot.press(key)
            await wait_for(lambda: app.screen.is_modal, pilot)
            await pilot.pause(0.1)
            dialog = app.screen.children[0].region
            controls = tuple(w.region for w in app.screen.query("*") if w.focusable)
            assert shortfalls(app, dialog, controls) == [], (theme, key)
            await pilot.press("escape")
            await wait_for(lambda: not app.screen.is_modal, pilot)


@pytest.mark.parametrize("theme", THEMES)
async def test_each_panes_border_stands_3_to_1_and_the_lightest_weight_shows(theme):
    """UX 7's finding 21: at a projector the light theme's pane borders were faint (#b9babb on #fbfbfa, 1.9:1)
    and the lowest attention weights nearly the background (#f4f9fe). Every pane's corner stands at least 3:1
    against what it is drawn on (WCAG's figure for a graphic that shows where a thing is), and the heatmap's
    lowest colour at least 1.2:1 (a weight near 0 shown, apart from the background, not loud)."""
    from tokenviz.render.colors import parse_hex
    from tokenviz.ui.colors import app_colors

    app = make_app(SamplingSettings(temperature=0), theme=theme)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        corners = []
        for y, strip in enumerate(app.screen._compositor.render_strips()):
            for segment in strip:
                if "╭" in segment.text and segment.style is not None:
                    fg, bg = rgb(segment.style, "color"), rgb(segment.style, "bgcolor")
                    corners.append((round(contrast(fg, bg), 2), y, fg, bg))
        assert len(corners) >= 4 and min(corners)[0] >= CONTROL, (theme, sorted(corners)[:3])
        colors = app_colors(app)
        background = parse_hex(app.current_theme.background)
        assert contrast(parse_hex(colors.heatmap_stops[0]), background) >= 1.2, theme
