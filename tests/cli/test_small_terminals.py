"""A student's 80x24 and a teacher's 120x36, in a real terminal (tmux) on the bundled model: what a
person sees. The colour legend, the decoded text, pieces shortened with … (never chopped), number keys
that act only on the rows on screen, the charts one at a time with their title, a cancelled view that
says so, view keys that toggle, and below the least size one line that says how big it must be."""

import re
import time

import pytest
from terminals import end, keys, screen, start, tmux, wait_gone, wait_screen

pytestmark = pytest.mark.bundled

QUESTION = "What is the capital of France?"


def next_token_rows(text: str) -> list[str]:
    """The token cells of the next-token pane's rows (rank, piece, id)."""
    return re.findall(r"│\s+▶?\d+ (\S+)\s+\d+\s+\d\.\d{3}", text)


def test_a_students_80x24(tmp_path):
    name = start((80, 24), QUESTION, "--chat", "--seed", "1")
    try:
        wait_screen(name, r"ready · step 0")
        text = wait_screen(name, r"\(√ scale\)")  # the attention pane's colour legend, once its rows come
        assert "text: " in text and "capital of France?" in text  # the decoded text has its line
        keys(name, "Space", "Space", "Space", "Space")
        text = wait_screen(name, r"step 4 ")
        pieces = next_token_rows(text)
        assert pieces and all(len(p) <= 8 for p in pieces)
        assert "Franc " not in text  # a piece cut short ends with …, never chopped into another token
        for line in text.splitlines():  # no border title or subtitle chopped mid-word without a mark
            assert not re.search(r"head me\b|for position …", line), line
        keys(name, "9")
        text = wait_screen(name, r"candidate 9 is not on screen")
        keys(name, "C")
        # the pane's title, then its chart drawn (a frame apart): both, with the keys that change the chart
        text = wait_screen(name, r"(?s)(?=.*charts · 1/6)(?=.*entropy)(?=.*← → change)")
        assert "entropy" in text and "← → change" in text
        keys(name, "Right")
        wait_screen(name, r"charts · 2/6")
        keys(name, "C")  # toggles back
        wait_screen(name, r"\(√ scale\)")
        tmux(name, "resize-window", "-t", name, "-x", "60", "-y", "15")
        wait_screen(name, r"at least 64×20 \(this is 60×15\)")
        tmux(name, "resize-window", "-t", name, "-x", "80", "-y", "24")
        wait_gone(name, "at least 64×20")
        keys(name, "q")
        assert "TOKENVIZ-EXITED 0" in wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
    finally:
        end(name)


def test_a_teachers_120x36_beams_cancelled_and_toggled():
    name = start((120, 36), "The Eiffel Tower is located in", "--seed", "2")
    try:
        wait_screen(name, r"ready · step 0")
        text = wait_screen(name, r"\(√ scale\)")
        assert "text: The Eiffel Tower is located in" in text
        keys(name, "B", pause=0.05)
        keys(name, "Escape")
        text = wait_screen(name, r"Press B to run it again")
        assert "beam search: cancelled" in text
        keys(name, "B")
        text = wait_screen(name, r"step  1 b1\+", timeout=120)
        assert "✗ pruned" in text  # the compact legend, whole
        keys(name, "B")  # with the beams shown, B returns to the attention map
        wait_screen(name, r"\(√ scale\)")
        assert "step  1 b1+" not in screen(name)
        keys(name, "q")
        assert "TOKENVIZ-EXITED 0" in wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
    finally:
        end(name)


def backgrounds(name: str) -> set[str]:
    """The background colours on screen, as the terminal receives them (capture-pane -e)."""
    return set(re.findall(r"\x1b\[(?:[0-9;]*;)?48;5;(\d+)", tmux(name, "capture-pane", "-e", "-p", "-t", name)))


def test_a_theme_switch_from_the_palette_repaints_every_cell():
    name = start((120, 36), "--theme", "tokenviz-contrast")
    try:
        wait_screen(name, r"ready · step 0")
        wait_screen(name, r"\(√ scale\)")
        dark = backgrounds(name) & {"16", "234", "236"}  # the contrast theme's black, surface and panel
        assert dark
        keys(name, "C-p")
        wait_screen(name, r"Search for commands")
        tmux(name, "send-keys", "-t", name, "-l", "Theme: tokenviz-light")
        wait_screen(name, r"Theme: tokenviz-light")
        keys(name, "Enter")
        deadline = time.monotonic() + 60  # (the state, not a pause: a busy machine repaints later)
        while (backgrounds(name) & dark or "231" not in backgrounds(name)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not backgrounds(name) & dark  # no cell kept from the old theme
        assert "231" in backgrounds(name)  # the light theme's white
        keys(name, "q")
        assert "TOKENVIZ-EXITED 0" in wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
    finally:
        end(name)
