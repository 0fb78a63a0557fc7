"""tokenviz in a real terminal: tmux runs it on the bundled model, send-keys types, capture-pane reads."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from terminals import (
    KEEP_S,
    QUIT_BOUND_S,
    end,
    new_session,
    quits_cleanly,
    sessions,
    start,
    tmux,
    tokenviz_pid,
    unique_name,
    wait_gone,
    wait_screen,
)

pytestmark = pytest.mark.bundled

PROMPT_IDS = [504, 414, 46682, 18669, 314, 3807, 281]  # "The Eiffel Tower is located in"


@pytest.fixture
def session():
    with sessions("--temperature 0.7", 1) as names:
        yield names[0]


def test_tokenviz_in_a_real_terminal(session):
    text = wait_screen(session, r"ready · step 0")
    for token_id in PROMPT_IDS:
        assert str(token_id) in text, token_id  # the prompt's ids are on screen
    assert "T 0.70" in text

    for _ in range(3):
        tmux(session, "send-keys", "-t", session, "Space")
        time.sleep(0.3)
    text = wait_screen(session, r"step 3 · 10 tokens")
    assert "7 prompt · 3 generated" in text

    tmux(session, "send-keys", "-t", session, "T")
    text = wait_screen(session, r"T 0\.80")

    started = time.monotonic()
    tmux(session, "send-keys", "-t", session, "q")
    text = wait_screen(session, r"TOKENVIZ-EXITED 0", timeout=10)
    assert time.monotonic() - started < QUIT_BOUND_S
    assert "Traceback" not in text


def test_quitting_mid_run_exits_cleanly():
    runs = {"mid-beam": "B", "mid-step": "Space", "mid-speculation": "S"}
    with sessions("--temperature 0.7", len(runs)) as names:
        for name in names:
            wait_screen(name, r"ready · step 0")
        for name, (run, key) in zip(names, runs.items()):
            tmux(name, "send-keys", "-t", name, key)
            time.sleep(0.1)
            started = time.monotonic()
            tmux(name, "send-keys", "-t", name, "q")
            text = wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
            assert time.monotonic() - started < QUIT_BOUND_S, run
            assert "TOKENVIZ-EXITED 0" in text, run  # not 134: no C++ abort from a thread torn down inside torch
            assert "terminate called" not in text and "Aborted" not in text and "Traceback" not in text, run


def test_sigterm_sighup_and_sigint_leave_a_sane_terminal_and_exit_128_plus_the_signal():
    signals = {"TERM": 15, "HUP": 1, "INT": 2}
    modes = "stty -a | tr ' ' '\\n' | grep -x -e echo -e -echo -e icanon -e -icanon; "
    with sessions("", len(signals), after=modes) as names:
        for name in names:
            wait_screen(name, r"ready · step 0")
        for name, (signum, number) in zip(names, signals.items()):
            started = time.monotonic()
            subprocess.run(["kill", f"-{signum}", tokenviz_pid(name)], check=True)
            text = wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
            assert time.monotonic() - started < QUIT_BOUND_S, signum
            assert f"TOKENVIZ-EXITED {128 + number}" in text and "Traceback" not in text, signum  # a script can tell
            assert tmux(name, "display", "-p", "-t", name, "#{alternate_on} #{cursor_flag}").split() == ["0", "1"], (
                signum
            )
            text = wait_screen(name, r"icanon", timeout=5)
            lines = text.split()
            assert "echo" in lines and "icanon" in lines and "-echo" not in lines and "-icanon" not in lines, signum


def test_a_hostile_journey_cannot_drive_the_terminal(tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from apptools import frozen_recording

    from tokenviz.files.journey_file import journey_file

    doc = journey_file(*frozen_recording(steps=2))
    doc["replay"]["info"]["name"] = "\x1b]0;PWNED-TITLE\x07\x1b[2J"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    name = start((160, 48), "replay", str(path))
    try:
        text = wait_screen(name, r"attends to", timeout=30)
        assert "tokens" in text and "ready · step 2" in text  # the screen was not cleared
        assert "PWNED" not in tmux(name, "display-message", "-p", "-t", name, "#{pane_title}")  # nor the title set
        quits_cleanly(name)
    finally:
        end(name)


SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colour_codes(text: str) -> set[str]:
    """The colour parameters (30-48, 90-107; not 39 and 49, the defaults) of every SGR sequence."""
    codes = set()
    for params in SGR.findall(text):
        for p in params.split(";"):
            if p and (30 <= int(p) <= 48 or 90 <= int(p) <= 107) and p != "39":
                codes.add(p)
    return codes


@pytest.mark.parametrize("no_color", [False, True], ids=["colour", "NO_COLOR"])
def test_no_color_draws_without_colour(tmp_path, no_color):
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from apptools import frozen_recording

    from tokenviz.files.journey_file import journey_file

    path = tmp_path / "journey.json"
    path.write_text(json.dumps(journey_file(*frozen_recording(steps=2))))
    name = unique_name()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"TERM": "xterm-256color"}
    prefix = "NO_COLOR=1 " if no_color else ""
    command = f"{prefix}{sys.executable} -m tokenviz replay {path}; echo TOKENVIZ-EXITED $?; sleep {KEEP_S}"
    new_session(name, (160, 48), command, env)
    try:
        wait_screen(name, r"attends to", timeout=30)
        drawn = tmux(name, "capture-pane", "-p", "-e", "-t", name)
        if no_color:
            assert colour_codes(drawn) == set()
            assert any(shade in drawn for shade in "░▒▓█")  # the heatmap in shade glyphs
        else:
            assert colour_codes(drawn)  # the check above can fail
        quits_cleanly(name)
    finally:
        end(name)


def test_chat_mode_answers_the_question_at_80x24():
    name = start((80, 24), "--chat", "--temperature", "0")
    try:
        wait_screen(name, r"ready · step 0")
        tmux(name, "send-keys", "-t", name, "a")
        text = wait_screen(name, r"stopped", timeout=60)
        assert "Paris" in text and "<|im_end|>" in text  # the answer, ended by the template's end of turn
    finally:
        end(name)


def test_resizes_during_autoplay_and_the_newest_token_in_view_after_60_steps():
    name = start((80, 24), "1, 2, 3, 4, 5, 6,", "--temperature", "0", "--max-new-tokens", "60")
    try:
        wait_screen(name, r"ready · step 0")
        tmux(name, "send-keys", "-t", name, "a")
        for size in ("120x36", "80x24", "200x60", "80x24"):  # while it plays
            width, height = size.split("x")
            tmux(name, "resize-window", "-t", name, "-x", width, "-y", height)
            time.sleep(0.7)
        text = wait_screen(name, r"stopped: .*· step 60", timeout=90)
        lines = text.splitlines()
        assert len(lines) == 24 and lines[0].startswith("╭─ tokens") and "q quit" in lines[-1]
        assert any(line.startswith("╭─ sampling") for line in lines)  # every pane is still laid out
        shown = re.search(r"lines (\d+)-(\d+) of (\d+)", text)
        assert shown is not None and shown.group(2) == shown.group(3)  # the last line, the newest token's
        prompt_len = int(re.search(r"(\d+) prompt · 60 generated", text).group(1))
        # the cursor follows the newest token the model has read (the 60th was taken at the stop, never fed)
        assert f"cursor at position {prompt_len + 58}" in text
        quits_cleanly(name)
    finally:
        end(name)


def test_quitting_mid_prefill_exits_at_once():
    prompt = "The Eiffel Tower is located in Paris, the capital of France. " * 150  # about 2,000 tokens
    name = start((120, 36), prompt)
    try:
        wait_screen(name, r"prefilling: \d+ of \d+ prompt tokens")
        started = time.monotonic()
        tmux(name, "send-keys", "-t", name, "q")
        text = wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)
        # Measured 0.83-0.94 s on 2 cores (torch's threads busy the while; 2.1 s when quitting waited
        # for the chunk in progress); the whole prefill takes several seconds more.
        assert time.monotonic() - started < QUIT_BOUND_S
        assert "TOKENVIZ-EXITED 0" in text and "Traceback" not in text
    finally:
        end(name)


def footer_and_status(text: str) -> tuple[str, str]:
    lines = text.rstrip("\n").splitlines()
    return lines[-1], lines[-2]


def test_the_first_five_minutes_key_sequences_at_120x36(tmp_path):
    """Issue 11's observations 4, 7, 8, 9 and 10, by their key sequences, on the bundled model."""
    name = start((120, 36), cwd=str(tmp_path))
    try:
        text = wait_screen(name, r"ready · step 0")
        footer, status = footer_and_status(text)
        assert footer.lstrip().startswith("q quit") and "? help" in footer  # 8: never cut at 120 columns
        assert "cpu" in status and "float32" in status  # 8: device and dtype kept
        assert "raw p" in text and "final" in text  # 7: raw and final are named
        assert not re.search(r"\b0\.000\b", text)  # 7: a tiny p never reads 0 (the sampling pane writes 1.2e-05)
        for _ in range(2):
            tmux(name, "send-keys", "-t", name, "Space")
            time.sleep(0.3)
        wait_screen(name, r"ready · step 2")
        tmux(name, "send-keys", "-t", name, "Left")
        text = wait_screen(name, r"cursor at position 7\b")
        # 4: a candidate on screen for position 8, not the token taken there (▶), chosen by its number
        rows = re.findall(r"│\s+(▶?)(\d) (\S+)\s+(\d+)\s", text)
        rank, piece, token_id = next((r, p, i) for mark, r, p, i in rows if not mark and r != "1")
        tmux(name, "send-keys", "-t", name, rank)
        wait_screen(name, rf"(?s){re.escape(piece)} {token_id}\s.*cursor at position 8\b", timeout=30)
        tmux(name, "send-keys", "-t", name, "Left")
        assert "forced (a branch)" in wait_screen(name, r"forced \(a branch\)", timeout=10)
        tmux(name, "send-keys", "-t", name, "h")
        wait_screen(name, r"largest weight any head gives")  # 7: head max is not called attention weights
        tmux(name, "send-keys", "-t", name, "?")
        wait_screen(name, r"watch the model think(?s:.*)Escape")  # 10: the help says how to close it
        tmux(name, "send-keys", "-t", name, "Escape")
        wait_gone(name, "watch the model think")
        tmux(name, "send-keys", "-t", name, "s")
        assert re.search(r"seed \d{1,6}\b", wait_screen(name, r"seed \d+"))  # 10: a short seed
        tmux(name, "send-keys", "-t", name, "x")
        wait_screen(name, r"saved", timeout=30)
        quits_cleanly(name)
    finally:
        end(name)
    saved = sorted(tmp_path.glob("*.json"))
    assert saved, list(tmp_path.iterdir())
    name = start((120, 36), "replay", str(saved[0]))
    try:  # 9: a replay steps through its recording with the same keys
        text = wait_screen(name, r"step \d+", timeout=30)
        footer, _ = footer_and_status(text)
        assert "play/pause" not in footer and "prompt" not in footer  # only the keys that work here
        steps = int(re.search(r"step (\d+)", text).group(1))
        tmux(name, "send-keys", "-t", name, "BSpace")
        wait_screen(name, rf"step {steps - 1}\b", timeout=10)
        tmux(name, "send-keys", "-t", name, "Space")
        wait_screen(name, rf"step {steps}\b", timeout=10)
        quits_cleanly(name)
    finally:
        end(name)


def test_x_then_quitting_at_once_leaves_all_three_files_whole(tmp_path):
    """x writes the screenshot, the journey and its page; quitting right after (q in the same burst of
    keys, or SIGTERM) waits for them: nothing the user asked for is lost."""
    from tokenviz.files.journey_file import read_journey

    folders = {then: tmp_path / then for then in ("q", "SIGTERM")}
    for folder in folders.values():
        folder.mkdir()
    with sessions("--temperature 0", 2, size=(120, 36), cwds=[str(f) for f in folders.values()]) as names:
        for name in names:
            wait_screen(name, r"ready · step 0")
        for name, (then, folder) in zip(names, folders.items()):
            tmux(name, "send-keys", "-t", name, "Space")
            wait_screen(name, r"ready · step 1")
            if then == "q":
                tmux(name, "send-keys", "-t", name, "x", "q")
            else:
                pid = tokenviz_pid(name)
                tmux(name, "send-keys", "-t", name, "x")
                deadline = time.monotonic() + 30  # (a busy machine may take a while to read the key)
                while not list(folder.glob("tokenviz-*.svg")) and time.monotonic() < deadline:
                    time.sleep(0.01)  # the app writes the screenshot first, then asks for the journey and its page
                subprocess.run(["kill", "-TERM", pid], check=True)  # at once: those may be just queued
            text = wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=60)
            assert ("TOKENVIZ-EXITED 0" if then == "q" else "TOKENVIZ-EXITED 143") in text, text
    for then, folder in folders.items():
        written = sorted(p.suffix for p in folder.glob("tokenviz-*"))
        assert written == [".html", ".json", ".svg"], (then, written)
        journey = read_journey(next(folder.glob("tokenviz-*.json")))  # whole: it validates
        assert len(journey["replay"]["chips"]) - journey["replay"]["prompt_len"] == 1  # one step taken
        assert "</html>" in next(folder.glob("tokenviz-*.html")).read_text()
        assert not list(folder.glob(".*.tmp"))
