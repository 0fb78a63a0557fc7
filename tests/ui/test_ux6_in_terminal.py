"""UX 6's screen findings (issue 69) in a real terminal (tmux, a socket of its own), at the size where
each was seen, on a tiny model."""

import re

import pytest
from terminals import keys, quits_cleanly, screen, terminal, tmux, wait_screen
from tiny import save_tiny

pytestmark = pytest.mark.terminal


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-ux6"), "llama", context=256)


def header(text: str, side: int, width: int) -> str:
    """A comparison side's header (the lines above its panes), its wrapping undone."""
    lines = []
    for line in text.splitlines():
        if line.lstrip().startswith("╭"):
            break
        lines.append(line[side * width // 2 : (side + 1) * width // 2])
    return re.sub(r"\s+", " ", " ".join(lines)).strip()


def test_presets_side_by_side_name_every_setting_that_differs_at_120_columns(tiny_dir):
    """Finding 6: `compare --against preset=creative` runs (it was refused as not NAME=VALUE), and each
    header, at 120 columns, names every setting that differs (the frequency penalty was cut to "…")."""
    with terminal((120, 36), "compare", "The cat sat", "--model", tiny_dir, "--preset", "factual",
                  "--against", "preset=creative") as name:  # fmt: skip
        text = wait_screen(name, r"B: ≠ preset creative")
        a, b = header(text, 0, 120), header(text, 1, 120)
        for shown, wanted in (
            (a, ("A: ≠ preset factual", "≠ sampling T 0.2", "≠ top-p 0.9", "≠ presence/frequency 0/0 ")),
            (b, ("B: ≠ preset creative", "≠ sampling T 1", "≠ top-p 0.95", "≠ presence/frequency 0/0.3")),
        ):
            for words in wanted:
                assert words in shown + " ", (words, shown)
        assert "seed" not in a  # (what both share: dim, where it fits, after the differences)
        top = next(line for line in text.splitlines() if "╭─ tokens" in line)  # UX 7's 13: a taller header
        assert top.count("╭─ tokens") == 2, text  # pushed its side's panes a row below the other's
        quits_cleanly(name)
        assert "Traceback" not in screen(name)


def test_each_sampling_stage_names_itself_in_words_at_80x24(tiny_dir):
    """Finding 11: the creative preset's stage line read "softmax → 0/0.3: 4↓ → p=0.95: 11 → draw" under a
    column "pres/fr"; each stage now says its name in a word, its count what it did."""
    with terminal((80, 24), "The cat sat", "--model", tiny_dir, "--preset", "creative") as name:
        wait_screen(name, r"ready · step 0")
        keys(name, *["Space"] * 6)
        text = wait_screen(name, r"ready · step 6")
        assert re.search(r"softmax → freq 0\.3: \d+ lowered → top-p 0\.95: \d+ → draw", text), text
        header = next(line for line in text.splitlines() if "raw" in line and "final" in line and "top-p" in line)
        assert " freq " in header and "pres/fr" not in text, header
        quits_cleanly(name)


def test_a_key_that_changes_the_model_says_so_at_once_at_200x60(tiny_dir):
    """Finding 5: `z` (and an `I` entry) gave no sign until the model had run again under it (12 s on a
    busy machine): the user pressed it again and turned it back off. The edit is said at once; pressed
    again, the head is restored, said as such."""
    with terminal((200, 60), "The cat sat", "--model", tiny_dir) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "h", "h")  # (mean, max, then head 0)
        wait_screen(name, r"head 0 of 4")
        keys(name, "z")
        wait_screen(name, r"ablate L2\.H0 \(zero\): on · the model runs again with it…")
        wait_screen(name, r"ready · step 0 · 4 tokens · ablate L2\.H0 \(zero\)")
        keys(name, "z")
        wait_screen(name, r"ablate L2\.H0 \(zero\): removed · the model runs again")  # (the toast wraps)
        quits_cleanly(name)


def test_autoplay_at_full_speed_shows_its_first_step_and_says_what_each_frame_skips(tiny_dir):
    """Finding 7 at 120x36: autoplay at full speed showed "playing · step 0" for 4 s, then step 6, 10, 15
    (a frame spaced by 40 times its cost). Its first step is drawn at once, no frame waits past a
    second, and where a frame shows several steps the status says how many."""
    long_context = save_tiny(tiny_dir + "-4096", "llama", context=4096)  # (a run longer than any pause in the polling)
    with terminal((120, 36), "The cat sat", "--model", long_context, "--max-new-tokens", "4000") as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "a")
        wait_screen(name, r"playing · step 1 ", timeout=60)
        shown = wait_screen(name, r"playing \(\+(\d+) since the last frame\) · step \d+", timeout=60)
        assert int(re.search(r"\+(\d+) since", shown).group(1)) > 1
        keys(name, "a")
        wait_screen(name, r"ready · step \d+")
        assert "since the last frame" not in screen(name)  # (said only while autoplay runs)
        quits_cleanly(name)


def test_the_diagnosis_says_what_it_checked_and_where_the_model_was_least_sure_at_80x24(tiny_dir):
    """Finding 8: `y` said "nothing unexpected measured" of a wrong answer. It now says what it checked,
    what it cannot judge (a fact), and lists the steps where the model was least sure, each a link."""
    with terminal((80, 24), "The cat sat", "--model", tiny_dir, "--max-new-tokens", "8", "--temperature", "0") as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "a")
        wait_screen(name, r"stopped: max new tokens")
        keys(name, "y")
        wait_screen(name, r"why the text looks as it does")
        keys(name, "End")
        shown = wait_screen(name, r"highest entropy: step \d+")
        left = re.sub(r"\s+", " ", " ".join(line[1:].split("│")[0] for line in shown.splitlines() if line[:1] == "│"))
        assert re.search(r"highest entropy: step \d+ ·sat p 0\.\d{3} · \d\.\d\d bits", left), left
        quits_cleanly(name)


def test_the_branches_view_says_where_the_paths_part_whole_at_80x24(tiny_dir):
    """Finding 17: at 80x24 the branches view's subtitle was cut ("they part after positio…")."""
    with terminal((80, 24), "The cat sat", "--model", tiny_dir) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space", "Space")
        wait_screen(name, r"ready · step 3")
        keys(name, "BSpace", "BSpace")
        wait_screen(name, r"ready · step 1")
        keys(name, "3", "b")  # (another token where a path was: the old one kept as a branch)
        shown = wait_screen(name, r"2 paths · part after \d+ ─")
        assert "positio…" not in shown
        quits_cleanly(name)


def test_the_tokens_pane_says_the_prompt_scrolled_above_at_80x24(tiny_dir):
    """Finding 28: at 80x24 the tokens pane scrolled the prompt out of view after the first steps and only
    "lines 2-2 of 2", late in its subtitle, said so; the subtitle now starts with an arrow up. (Two chip lines
    show at this size since UX 7's finding 15: the steps are as many as it takes to need a third.)"""
    import re

    with terminal((80, 24), "The cat sat", "--model", tiny_dir) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, *["Space"] * 24)
        shown = wait_screen(name, r"ready · step 24")
        border = next(line for line in shown.splitlines() if "generated" in line and line.startswith("╰"))
        said = re.search(r"↑ 4 prompt · 24 generated · cursor at position 27 · lines (\d+)-(\d+) of (\d+)", border)
        assert said and int(said[2]) - int(said[1]) == 1 and said[2] == said[3] and int(said[1]) > 1, border
        quits_cleanly(name)


def test_no_pane_moves_while_the_model_loads_at_120x36(tiny_dir):
    """Finding 27: at 120x36 the first frame showed 8 candidates and an empty row: the loading bar took a
    line of its own while the model loaded and prefilled, and the panes under it moved when it went. Read
    every 50 ms from the first frame to ready, the next-token pane's top border stays on one row."""
    import time

    rows, loading = set(), False
    with terminal((120, 36), "The cat sat on the mat", "--model", tiny_dir) as name:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = screen(name)
            lines = text.splitlines()
            rows |= {i for i, line in enumerate(lines) if "─ next token " in line}
            loading = loading or "%" in lines[0]  # (the bar, over the tokens pane's border)
            if "ready · step 0" in text:
                break
            time.sleep(0.05)
        assert "ready · step 0" in text and len(rows) == 1, rows
        assert loading  # (the bar was seen, and still no pane moved)
        quits_cleanly(name)


def left_pane(text: str) -> str:
    """The text of the panes on the left of the middle row (the view), its lines joined."""
    lines = [line.split("││")[0].lstrip("│") for line in text.splitlines() if "││" in line]
    return re.sub(r"\s+", " ", " ".join(lines))


def test_the_views_numbers_at_120x36_rates_room_greedy_ticks_and_reset(tiny_dir):
    """Findings 2, 16, 20, 23 and 24 where they were seen, at 120x36: greedy's trailer gives the raw p (it
    said "final p"); the room under the attention map's newest row says the next rows come there; the
    timing view's two rates are of the same steps and all work is never faster than the forward pass
    alone (1.0 beside 1.1); the charts' value axis labels every tick, evenly stepped from 0 (4.82 4.02
    3.21 · 1.61 0.80); after r the status line says no decode rate until a step is taken."""
    args = ("The cat sat", "--model", tiny_dir, "--temperature", "0", "--max-new-tokens", "60")
    with terminal((120, 36), *args) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space")
        text = wait_screen(name, r"ready · step 1 ")
        assert re.search(r"→ next: \S+ \(greedy: argmax, raw p 0\.\d{3}\)", text), text
        assert "↓ the next tokens' rows come here" in text, text
        for _ in range(19):
            keys(name, "Space", pause=0.1)
        wait_screen(name, r"ready · step 20 ")
        keys(name, "i")
        shown = left_pane(wait_screen(name, r"with all work"))
        rates = re.search(r"the last 16 steps: ([\d.]+) tokens/s from the forward pass alone, ([\d.]+) with all", shown)
        assert rates and float(rates[1]) >= float(rates[2]), shown
        keys(name, "C")
        text = wait_screen(name, r"entropy \(bits, left\)")
        ticks = [float(m[1]) for line in text.splitlines() if (m := re.match(r"│\s*([\d.]+)┤", line))]
        steps = {round(b - a, 6) for a, b in zip(ticks[1:], ticks)}  # (top to bottom: each the one below + step)
        assert len(ticks) >= 3 and ticks[-1] == 0 and len(steps) == 1, text
        keys(name, "r")
        status = wait_screen(name, r"ready · step 0 ").splitlines()[-2]
        assert "tok/s" not in status, status
        quits_cleanly(name)


def test_a_settings_typo_keeps_the_dialog_and_a_refusal_says_why_at_80x24(tiny_dir):
    """Finding 12: `=` with a typo closed the dialog and lost the text, and the line named "top_k, top_p"
    where the dialog and the CLI say "top-k". Finding 4: `R` on a dense model said "expert routing needs the
    routing"; it says the model has no experts."""
    with terminal((80, 24), "The cat sat", "--model", tiny_dir) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "=")
        wait_screen(name, r"NAME=VALUE")
        tmux(name, "send-keys", "-t", name, "-l", "top_kk=3")
        keys(name, "Enter")
        text = wait_screen(name, r"top-k, top-p")
        assert "top_kk=3" in text and "top_k," not in text, text
        keys(name, "Escape")
        keys(name, "R")  # (finding 4: a refusal names the reason, not the question back)
        text = wait_screen(name, r"has no (experts|mixture-of-experts)")
        assert "routing needs the routing" not in text, text
        quits_cleanly(name)
