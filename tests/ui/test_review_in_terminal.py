"""The review's screen findings (issue 51) in a real terminal (tmux), at each of its three people's
sizes (80x24, 120x36, 200x60), on a tiny model: what each person sees, as they saw it."""

import re
import time

import pytest
from terminals import (
    at_each_size,
    dialog_text,
    keys,
    quits_cleanly,
    screen,
    tmux,
    type_into_field,
    wait_gone,
    wait_screen,
    wait_until,
)
from tiny import save_tiny

pytestmark = pytest.mark.terminal


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-review"), "llama", context=256)


def left_panes(text: str) -> str:
    """The text of the panes at the screen's left edge, their lines joined and their wrapping undone."""
    return re.sub(r"\s+", " ", " ".join(line[1:].split("│")[0] for line in text.splitlines() if line.startswith("│")))


def palette(name: str, query: str) -> None:
    """The command palette opened, then `query` typed into it (typed before it opens, on a busy machine,
    each letter would be a key of the app's)."""
    keys(name, "C-p")
    wait_screen(name, r"Search for commands")
    tmux(name, "send-keys", "-t", name, "-l", query)


def line_of(text: str, pattern: str) -> str:
    return next(line for line in text.splitlines() if re.search(pattern, line))


def test_a_grammar_run_to_its_end(tiny_dir):
    """Item 8: the chosen token keeps its row in the sampling pane, below the candidates the grammar
    struck out. Item 9: after the stop the text line ends with the token the stop took. Item 11: the
    attention pane marks the cursor's own row."""

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "a")
        text = wait_screen(name, r"stopped: the grammar is complete", timeout=60)
        assert re.search(r"text: The cat sat\d{3}x\s*│", text), text  # the final x, taken at the stop, included
        rows = [line.strip("│ ") for line in text.splitlines() if re.match(r"│[✗▶]\S", line)]
        assert rows[-1].startswith("▶x") and rows[0].startswith("✗"), rows
        cursor = re.search(r"cursor at position (\d+)", text).group(1)
        assert re.search(rf"│▶ +{cursor} ", text), (cursor, text)
        quits_cleanly(name)

    at_each_size(check, "The cat sat", "--model", tiny_dir, "--temperature", "0", "--regex", "[0-9]{3}x")


def test_a_greedy_run_says_why_and_a_preset_or_a_typed_setting_takes_effect(tiny_dir):
    """Item 13: once the run stops the status line says why its text looks as it does (at 80x24 too),
    and y opens the evidence. Item 9: the text line ends with the stop's token. Item 12: F3 sets the
    creative preset and names it, = takes a typed setting, and the palette finds settings by name.
    Item 11: the branch tree says what its shared count counts."""

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "a")
        text = wait_screen(name, r"stopped: max new tokens \(8\)", timeout=60)
        assert re.search(r"text: The cat sat( sat){8}\s*│", text), text  # 8 new tokens, the last one shown
        status = wait_screen(name, r"why: cut off mid-sentence").splitlines()[-2]
        assert "why: cut off mid-sentence" in status, status
        keys(name, "y")
        wait_screen(name, r"cause: the new-token limit")
        keys(name, "y", "F3")
        wait_screen(name, r"T 1\.00 .*preset creative")
        keys(name, "=")
        wait_screen(name, r"NAME=VALUE")
        type_into_field(name, "temperature=0.3 top-k=5")
        keys(name, "Enter")
        text = wait_screen(name, r"T 0\.30 · top-k 5")
        assert "preset" not in line_of(text, r"T 0\.30 · top-k 5")  # no longer the preset's settings
        palette(name, "temperature")
        wait_screen(name, r"Temperature up")
        keys(name, "Escape")  # (the query typed hides the palette's placeholder: its list is what goes)
        wait_gone(name, "Temperature up (T)")
        palette(name, "creative")
        wait_screen(name, r"Preset: creative \(F3\),")  # (its key, as every entry's: issue 69, finding 13)
        keys(name, "Escape")
        wait_gone(name, "Preset: creative (F3),")
        keys(name, "Left", "Left", "2", "b")
        wait_screen(name, r"branch 1 ")
        keys(name, "Down", "Down", "Down")  # (at 80x24 the second branch's line is below the pane's fold)
        said = re.compile(r"branch 1 .* its first \d+ generated as current's")  # (the line drawn whole: it wraps)
        shown = left_panes(wait_until(name, lambda text: bool(said.search(left_panes(text))), "branch 1's line"))
        assert "shares" not in shown, shown
        quits_cleanly(name)

    at_each_size(check, "The cat sat", "--model", tiny_dir, "--temperature", "0", "--max-new-tokens", "8")


def test_keys_typed_after_q_do_nothing_and_it_exits_cleanly(tiny_dir):
    """Found in the review's terminals: q then e typed at once opened the prompt editor on an app already
    ending (a traceback, exit 1)."""

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        tmux(name, "send-keys", "-t", name, "-l", "qe=GIYJ?")
        text = wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=20)
        assert "TOKENVIZ-EXITED 0" in text and "Traceback" not in text, text

    at_each_size(check, "The cat sat", "--model", tiny_dir)


def test_the_light_themes_help_says_the_colours_it_draws(tiny_dir):
    """Item 11: in the light theme the help said 'brighter = more weight' and 'grey chips' (heavy
    attention is dark navy there)."""

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "?")
        wait_screen(name, r"tokenviz: watch the model think")
        pages = []
        for _ in range(40):  # (at 80x24 the colours are a page or two down: a few lines at a time, so
            pages.append(dialog_text(screen(name)))  # that a page holds each sentence whole)
            if "darker on a light one" in pages[-1]:
                break
            keys(name, "Down", "Down", "Down", pause=0.1)
        said = " ".join(pages)
        assert "chips of two colours, the theme's" in said, said
        assert "darker on a light one" in said and "brighter = more weight" not in said and "grey chips" not in said
        keys(name, "Escape")
        wait_gone(name, "tokenviz: watch the model think")  # (q on the help would close it, not the app)
        quits_cleanly(name)

    at_each_size(check, "The cat sat", "--model", tiny_dir, "--theme", "tokenviz-light")


def test_speculation_and_a_comparison_under_steering(tiny_dir):
    """Item 11: the speculation view's first line is whole (at 120x36 it was cut mid-figure). Item 6: a
    comparison opened under an intervention names it in both headers, with no dangling separator."""

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space", "S")
        text = wait_screen(name, r"round  1: ", timeout=60)
        lines = text.splitlines()
        below = lines[next(i for i, line in enumerate(lines) if "─ speculative decoding" in line) + 1]
        first = below[1:].split("│")[0].strip()  # the view's first line, in the pane at the left
        assert re.search(r"\d+ (target )?(fwd|forwards).* \d+%", first) and "…" not in first, first  # (its fullest fit)
        keys(name, "S", "Y")
        wait_screen(name, r"Change the model while you watch")
        type_into_field(name, "1:8:the:a")
        keys(name, "Enter", "Escape")
        wait_screen(name, r"steer L1 ×8")
        # (the dialog gone before C-p: an Escape the app has not yet read takes the next byte as its
        # modifier, and C-p went with it in a loaded full run)
        wait_gone(name, r"Change the model while you watch")
        palette(name, "Compare with other")
        wait_screen(name, r"Compare with other settings, side by side")
        keys(name, "Enter")
        wait_screen(name, r"NAME=VALUE")
        type_into_field(name, "temperature=2 top-k=0")
        keys(name, "Enter")
        text = wait_screen(name, r"B: .*T 2", timeout=60)
        header = line_of(text, r"A: ").strip()
        for side in re.split(r"\s{3,}", header):  # each side's header: whole fields, a cut one said with …
            assert not side.endswith("·"), header
            assert "interventions steer L1 ×8" in side or side.endswith("· …"), header
        text = wait_screen(name, r"under interventions[\s\S]*under interventions", timeout=60)  # (panes drawn)
        assert text.count("under interventions") == 2, text  # each side's next-token pane says so
        parting = r"the paths part at step"
        clear = wait_until(  # (the steering's notification lies over the pane's lines until it goes)
            name, lambda t: parting in t and "▌" not in line_of(t, parting), "the parting line uncovered", 60
        )
        part = line_of(clear, parting)
        assert part.rstrip(" │").endswith(("…", "one context")), part  # (it was cut bare: "so each row compa")
        quits_cleanly(name)

    at_each_size(check, "The cat sat on the mat. The cat sat", "--model", tiny_dir, "--temperature", "0")


def test_the_sampling_pane_the_text_view_and_the_charts(tiny_dir):
    """Item 11: a short sampling pane gives its rows to the kept tokens (at 80x24 it showed 2 of 8); D
    opens on the answer, not the top of a long prompt; every chart keeps its title and says which
    colour is which line."""
    prompt = " ".join(f"w{i}" for i in range(60)) + " And so"

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        text = wait_screen(name, r"ready · step 2 ")
        lines = text.splitlines()
        top = next(i for i, line in enumerate(lines) if line.startswith("╭─ sampling"))
        pane = lines[top + 1 : next(i for i in range(top + 1, len(lines)) if lines[i].startswith("╰"))]
        kept = int(re.search(r"p=0\.9: (\d+)", " ".join(pane)).group(1))
        rows = [line for line in pane if re.match(r"│[▶ ]\S.* \d\.\d{3} ", line)]
        assert len(rows) >= min(kept, 3), pane
        keys(name, "D")
        text = wait_screen(name, r"─ text ")
        assert "And so" in left_panes(text.split("─ text ", 1)[1]), text  # the answer's line in view
        keys(name, "D", "C")
        wait_screen(name, r"─ charts")
        time.sleep(1)  # (laid out: a pane too small for the grid shows one chart at a time)
        one_at_a_time = "charts · 1/6" in screen(name)
        for shown in range(1, 7 if one_at_a_time else 2):
            text = wait_screen(name, rf"charts · {shown}/6" if one_at_a_time else r"─ charts")
            lines = text.splitlines()
            title = next(i for i, line in enumerate(lines) if "─ charts" in line)
            first = lines[title + 1][1:].split("│")[0].strip()
            assert first and not first.startswith(("┌", "│")), (shown, first)  # a title above the frame
            bottom = lines[next(i for i in range(title + 1, len(lines)) if lines[i].startswith("╰"))]
            keyed = "━━ " in bottom or "nothing yet" in lines[title] or not one_at_a_time  # (plotext keys them)
            assert keyed, (shown, bottom)  # which colour is which line
            keys(name, "Right")
        quits_cleanly(name)

    at_each_size(check, prompt, "--model", tiny_dir, "--top-k", "8", "--seed", "1")


def test_the_chat_switch_of_the_prompt_editor(tmp_path_factory):
    """Item 11: the chat switch drew an X when off (read as ticked); its label is cut with …, never bare."""
    from tiny import tiny_chat_model

    directory = tmp_path_factory.mktemp("tiny-chat")
    loaded = tiny_chat_model()
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "e")
        switch = line_of(wait_screen(name, r"chat: a user message"), r"chat: a user message")
        assert "▐ ▌ chat" in switch and "X" not in switch, switch  # off: an empty box
        assert re.search(r"chat: a user message through the model's chat (template|te?m?p?l?a?t?…)", switch), switch
        # The text has the keys (a Tab sent before the editor took them types a space). Ctrl+E, not End:
        # End is an escape sequence, and on a loaded machine its ESC read alone is Escape, closing the editor.
        # (On a loaded machine a key sent as the editor opens may come before its text has the focus: the
        # "!" is then typed where the cursor is, which is all this waits for.)
        keys(name, "C-e", "!")
        wait_screen(name, r"Hi there!|!Hi there")
        keys(name, "BSpace", "Tab", "Space")  # (the switch, from the text)
        switch = line_of(wait_screen(name, r"▐✓▌ chat"), r"chat: a user message")
        assert "X" not in switch, switch
        keys(name, "Escape")
        wait_gone(name, "Prompt: ctrl+s")  # (q in the editor would be typed, not quit)
        quits_cleanly(name)

    at_each_size(check, "Hi there", "--model", str(directory))


def test_a_recording_says_so(tiny_dir, tmp_path, monkeypatch, capsys):
    """Item 11: replay said nothing on screen that it is a recording, and its status showed `fwd 412.2 ms`
    as if a pass had just run."""
    from clitools import invoke

    path = tmp_path / "journey.json"
    args = ["--model", tiny_dir, "--steps", "4", "--temperature", "0", "--save", str(path)]
    code, _, err = invoke(monkeypatch, capsys, "trace", "The cat sat", *args)
    assert code == 0, err

    def check(name, size):
        status = wait_screen(name, r"recording · ").splitlines()[-2]
        assert status.strip().startswith("recording · "), status
        assert " fwd " not in status.replace("recorded fwd", ""), status
        quits_cleanly(name)

    at_each_size(check, "replay", str(path))


def test_a_views_line_too_long_for_it_ends_in_an_ellipsis(tiny_dir):
    """Item 11: the lens and attribution views cut a long line bare ('the first-order ch'); a line cut
    now ends in …, and a line that fits is whole."""
    whole = {
        "leave-one-out: the change in log p": "(exact; one forward pass a token)",
        "+ raised the token's log p": "(chips shaded by size)",
    }

    def check(name, size):
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space", "A")
        rows = r"[-+]\d\.\d{3} █"  # (the attribution's rows: it has run)
        if "leave-one-out anyway" in wait_screen(name, rf"{rows}|leave-one-out anyway", timeout=60):
            keys(name, "Down", "Enter")  # (a busy machine's estimate asks first: the exact one, as asked)
        text = wait_screen(name, rows, timeout=120)
        for start, end in whole.items():
            line = line_of(text, re.escape(start))[1:].split("│")[0].rstrip()
            assert line.endswith(("…", end)), (start, line)
        quits_cleanly(name)

    at_each_size(check, "The cat sat on the mat", "--model", tiny_dir, "--temperature", "0")
