"""Every dialog shows its whole syntax, wrapped to the dialog, at every size from 80x24: nothing of
what it asks is cut at the right. The grammar dialog, reopened, shows the grammar in force and begins
with it."""

import pytest
from apptools import make_app, settle, wait_for
from textual.geometry import Region
from textual.widgets import Input, Label

from tokenviz.contract.grammar import Grammar
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.screens import GrammarDialog, InterventionsDialog, WatchScreen

SIZES = [(80, 24), (120, 36), (200, 60)]


def shown(label: Label) -> str:
    """The words a label shows on screen, its lines joined (what is cut off is not in it)."""
    width, height = label.size
    lines = label.render_lines(Region(0, 0, width, height))
    return " ".join("".join(segment.text for segment in line).strip() for line in lines)


def whole(label: Label) -> bool:
    """Whether every word the label holds is on screen: it fits its dialog's width (else the dialog
    cuts it at the right) and its lines hold all its words."""
    words = str(label.render()).split()
    fits = label.region.right <= label.parent.content_region.right and label.region.x >= label.parent.content_region.x
    return fits and " ".join(words) == " ".join(shown(label).split())


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    "key, dialog, last_words",
    [
        ("G", GrammarDialog, "Escape closes."),
        ("I", InterventionsDialog, "Escape closes."),
        ("w", WatchScreen, "then Enter"),
    ],
)
async def test_a_dialog_shows_its_whole_syntax(size, key, dialog, last_words):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press(key)
        await wait_for(lambda: isinstance(app.screen, dialog), pilot)
        await pilot.pause()
        labels = list(app.screen.query(Label))
        assert labels
        for label in labels:
            assert whole(label), (size, shown(label))
        assert any(shown(label).endswith(last_words) or last_words in shown(label) for label in labels)
        if dialog is InterventionsDialog:  # "[mean]" shown as typed (UX 7's 23: it was taken as markup and lost)
            said = " ".join(shown(label) for label in labels)
            assert "patch L:POS:TEXT" in said and "ablate L.H [mean], steer" in said, said


async def test_the_grammar_dialog_reopened_shows_and_begins_with_the_grammar_in_force():
    grammar = Grammar("regex", " (Paris|Rome)\\.", " (Paris|Rome)\\.")
    app = make_app(SamplingSettings(temperature=0, grammar=grammar))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("G")
        await wait_for(lambda: isinstance(app.screen, GrammarDialog), pilot)
        assert f"in force: {grammar.label}" in shown(app.screen.query_one("#grammar-in-force", Label))
        assert app.screen.query_one(Input).value == "regex  (Paris|Rome)\\."


@pytest.mark.parametrize("key, dialog", [("I", InterventionsDialog), ("G", GrammarDialog), ("w", WatchScreen)])
async def test_a_dialog_answers_once_when_enter_and_escape_come_at_once(key, dialog):
    """Enter then Escape typed at once on a loaded machine (a real terminal, 2026-12-02): Escape closed the
    dialog, then its field's Enter answered again: the answer taken after the cancel, and the journey's
    screen popped from under it (ScreenStackError, a traceback). The first answer is the only one."""
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        journey = app.screen
        await pilot.press(key)
        await wait_for(lambda: isinstance(app.screen, dialog), pilot)
        asked = app.screen
        answers = []
        asked._result_callbacks[-1].callback = answers.append  # (what the journey's screen would be told)
        field = asked.query_one(Input)
        field.value = "x"
        asked.action_cancel()  # Escape, handled first
        asked.post_message(Input.Submitted(field, field.value))  # the Enter already on its way
        await pilot.pause()
        await pilot.pause()
        assert answers == [None] and app.screen is journey
