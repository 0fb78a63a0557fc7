"""The prompt editor's chat switch reads on a projector: in every theme its tick (on) stands at
least 3:1 against its own background (WCAG's figure for controls), measured from the cells Textual
renders, and off it is an empty box (an X both ways read as ticked); and the editor's help line
wraps instead of being cut."""

import itertools

import pytest
from apptools import make_app, settle, wait_for
from textual.geometry import Region
from textual.widgets import Checkbox, Label

from tokenviz.render.colors import contrast
from tokenviz.ui.screens import PromptScreen


def mark_cell(box: Checkbox):
    """The switch's button as rendered, between its two sides: (its text, foreground, background)."""
    for strip in box.render_lines(Region(0, 0, box.outer_size.width, box.outer_size.height)):
        segments = list(strip)
        for left, s in itertools.pairwise(segments):
            if left.text == Checkbox.BUTTON_LEFT and s.style and s.style.bgcolor:
                return s.text, s.style.color, s.style.bgcolor
    raise AssertionError("no button rendered")


@pytest.mark.parametrize("theme", ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"])
async def test_the_chat_switch_stands_3_to_1_on_and_off(theme):
    from tokenviz.contract.settings import SamplingSettings

    app = make_app(SamplingSettings(temperature=0), theme=theme)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        app.push_screen(PromptScreen("hello", can_chat=True, chat=False))
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        await pilot.pause()
        box = app.screen.query_one(Checkbox)
        marks = []
        for value in (False, True):
            box.value = value
            await pilot.pause()
            mark = mark_cell(box)
            marks.append(mark)
        (off, _, off_back), (on, on_color, on_back) = marks
        assert off.strip() == "" and on.strip() == "✓"  # an empty box off (an X reads as ticked), a tick on
        assert contrast(on_color.triplet, on_back.triplet) >= 3.0, (theme, marks)
        screen_back = app.screen.query_one("Vertical").styles.background.rgb
        assert contrast(off_back.triplet, screen_back) > 1.0  # the empty box stands apart from the dialog
        label = app.screen.query_one(Label)
        assert label.region.right <= label.parent.content_region.right  # wrapped to the dialog, not cut
