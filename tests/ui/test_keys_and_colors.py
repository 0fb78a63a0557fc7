"""One key table makes the bindings, the palette and the help; one object resolves a theme's colours."""

import re

import pytest
from textual.theme import BUILTIN_THEMES

from tokenviz.ui.app import TokenvizApp
from tokenviz.ui.colors import DEFAULT_HEATMAP, theme_colors
from tokenviz.ui.compare_screen import CompareScreen
from tokenviz.ui.journey_screen import VIEWS, JourneyScreen
from tokenviz.ui.keys import JOURNEY_OWNERS, bindings, markdown_table, palette_entries, routed, unrouted
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.screens import HELP
from tokenviz.ui.themes import load_themes

# The journey screen's widgets by id, as it composes them: where a routed action runs.
JOURNEY_WIDGETS = {
    "tokens": TokensPane,
    "next-token": NextTokenPane,
    "sampling": SamplingPane,
    "attention": AttentionPane,
}
JOURNEY_WIDGETS.update(VIEWS)


def action_target(screen: type, action: str) -> object:
    """The method an action string names: on the app for "app.NAME", on the owning pane for a routed
    action ("route('beams', 'beams(5)')"), else on the screen."""
    namespace, _, name = action.rpartition(".") if action.startswith("app.") else ("", "", action)
    owner = TokenvizApp if namespace == "app" else screen
    if name.startswith("route("):
        assert callable(getattr(screen, "action_route", None))
        owner, name = JOURNEY_WIDGETS[JOURNEY_OWNERS[unrouted(name).split("(")[0]]], unrouted(name)
    method = re.match(r"\w+", name).group(0)
    return getattr(owner, f"action_{method}", None)


@pytest.mark.parametrize("screen", [JourneyScreen, CompareScreen])
def test_every_binding_comes_from_the_screens_table_and_names_a_real_action(screen):
    pressed = [p for row in screen.KEY_ROWS for p in row.presses]
    assert sorted((b.key, unrouted(b.action)) for b in screen.BINDINGS) == sorted((p.key, p.action) for p in pressed)
    for _, action in [(b.key, b.action) for b in bindings(screen.KEY_ROWS, screen.ACTION_OWNERS)] + palette_entries(
        screen.KEY_ROWS, screen.PALETTE_ONLY, screen.ACTION_OWNERS
    ):
        assert callable(action_target(screen, action)), action


def test_a_panes_action_is_routed_to_it_and_the_screens_own_are_not():
    assert routed("beams(5)", JOURNEY_OWNERS) == "route('beams', 'beams(5)')"
    assert unrouted(routed("adjust('top_k', -1)", JOURNEY_OWNERS)) == "adjust('top_k', -1)"
    assert routed("view('lens')", JOURNEY_OWNERS) == "view('lens')" and unrouted("step") == "step"
    for owner in set(JOURNEY_OWNERS.values()):  # every owner is a widget the screen composes
        assert owner in JOURNEY_WIDGETS
    # Each action the screen or a pane defines is one place's: no key could reach two of them.
    screen_own = {name for name in dir(JourneyScreen) if name.startswith("action_")}
    assert not screen_own & {f"action_{name}" for name in JOURNEY_OWNERS}


def test_the_footer_shows_the_short_labels_and_the_palette_the_long_ones():
    footer = [b.description for b in bindings() if b.show]
    assert footer[:4] == ["quit", "help", "step", "play/pause"]  # a narrow footer is cut at the right
    labels = [label for label, _ in palette_entries()]
    assert "View: logit lens" in labels and "Beam search, width 5" in labels and len(set(labels)) == len(labels)


def test_the_help_screen_shows_the_key_table():
    assert markdown_table() in HELP


@pytest.mark.parametrize("name", ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"])
def test_bundled_themes_set_every_colour_the_panes_use(name):
    theme = load_themes()[name]
    colors = theme_colors(theme)
    v = theme.variables
    assert colors.heatmap_stops == tuple(v["heatmap-stops"].split())
    assert (colors.bar, colors.bar_final, colors.chip_cursor, colors.chosen) == (
        v["bar-color"],
        v["bar-final-color"],
        v["chip-cursor"],
        v["chosen-color"],
    )
    assert (colors.chip_prompt, colors.chip_generated, colors.chip_newest, colors.heatmap_masked) == (
        v["chip-prompt"],
        v["chip-generated"],
        v["chip-newest"],
        v["heatmap-masked"],
    )


def test_another_textual_theme_gets_colours_from_its_own_palette():
    theme = BUILTIN_THEMES["nord"]
    colors = theme_colors(theme)
    assert colors.chip_cursor == theme.accent and colors.bar == theme.primary and colors.chosen == theme.success
    assert colors.heatmap_stops == tuple(DEFAULT_HEATMAP.split())
