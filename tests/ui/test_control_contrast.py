"""The prompt editor's chat switch reads on a projector: in every theme, on and off, its mark stands at
least 3:1 against its own background (WCAG's figure for controls), measured from the cells Textual
renders; and the editor's help line wraps instead of being cut."""

import pytest
from apptools import make_app, settle, wait_for
from textual.geometry import Region
from textual.widgets import Checkbox, Label

from tokenviz.render.colors import contrast
from tokenviz.ui.screens import PromptScreen


def mark_cell(box: Checkbox):
    """The switch's mark as rendered: (its text, foreground, background)."""
    for strip in box.render_lines(Region(0, 0, box.outer_size.width, box.outer_size.height)):
        for s in strip:
            if s.text.strip() == Checkbox.BUTTON_INNER and s.style and s.style.color:
                return s.text, s.style.color, s.style.bgcolor
    raise AssertionError("no mark rendered")


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
            assert contrast(mark[1].triplet, mark[2].triplet) >= 3.0, (theme, value, mark)
            marks.append(mark[1])
        assert marks[0] != marks[1]  # on and off tell apart by colour too
        label = app.screen.query_one(Label)
        assert label.region.right <= label.parent.content_region.right  # wrapped to the dialog, not cut
