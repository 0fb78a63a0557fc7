"""The line filter that skips Textual's ANSI-to-truecolor pass where it would change nothing draws
exactly what Textual's filter draws, and leaves a truecolor line as it was."""

from hypothesis import given
from hypothesis import strategies as st
from rich.segment import Segment
from rich.style import Style
from rich.terminal_theme import MONOKAI
from textual.color import Color
from textual.filter import ANSIToTruecolor

from tokenviz.ui.truecolor import SkipTruecolor, skipping

COLORS = [None, "red", "bright_blue", "color(200)", "default", "#102030", "#ffeedd"]
styles = st.one_of(
    st.none(),
    st.builds(
        lambda color, bgcolor, dim, bold: Style(color=color, bgcolor=bgcolor, dim=dim, bold=bold),
        st.sampled_from(COLORS),
        st.sampled_from(COLORS),
        st.booleans(),
        st.booleans(),
    ),
)
lines = st.lists(st.builds(Segment, st.sampled_from(["▀", "ab", " "]), styles), max_size=12)


@given(lines)
def test_what_is_drawn_equals_textuals_filter(line):
    textual = ANSIToTruecolor(MONOKAI)
    background = Color(10, 20, 30)
    ours = SkipTruecolor(textual).apply(line, background)
    assert [(s.text, s.style) for s in ours] == [(s.text, s.style) for s in textual.apply(line, background)]


def test_a_truecolor_line_is_passed_through_unbuilt():
    line = [Segment("▀", Style(color="#102030", bgcolor="#405060")), Segment("x"), Segment("y", Style(bold=True))]
    assert SkipTruecolor(ANSIToTruecolor(MONOKAI)).apply(line, Color(0, 0, 0)) is line


def test_each_textual_filter_gets_one_wrapper_and_a_new_one_replaces_it():
    wrappers: dict = {}
    first, second = ANSIToTruecolor(MONOKAI), ANSIToTruecolor(MONOKAI)
    a = skipping([first], wrappers)[0]
    assert skipping([first], wrappers)[0] is a and a.inner is first  # Strip caches lines by filter
    b = skipping([second], wrappers)[0]
    assert b is not a and b.inner is second and len(wrappers) == 1


async def test_the_app_draws_through_the_skipping_filter():
    from apptools import make_app

    app = make_app()
    async with app.run_test(size=(80, 24)):
        assert any(isinstance(f, SkipTruecolor) for f in app.get_line_filters())
        assert not any(type(f) is ANSIToTruecolor for f in app.get_line_filters())
