"""tokenviz in a real terminal: tmux runs it, send-keys types, capture-pane reads.

Each terminal is a tmux server of its own, on a socket named after the terminal (`tmux -L NAME`),
started and ended by the test: no other tmux server on the machine (another user's, another tool's,
another test's) can disturb it or be disturbed by it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from scratch import scratch_dir

# Quitting takes 0.24-0.30 s here (the bench's figure is the one to watch). The tests' bound catches
# a hang (seen: 20 minutes) or a quit that waits for the run in progress, and leaves a loaded machine
# room: a test asserts behaviour, not speed.
QUIT_BOUND_S = 3.0
# The three people of the review (issue 51): a student at 80x24, a teacher at a projector at 120x36,
# an engineer at 200x60. A screen's finding holds at each.
SIZES = ((80, 24), (120, 36), (200, 60))
ENV = {"HF_HUB_OFFLINE": "1", "TERM": "xterm-256color"}
# After tokenviz exits, its shell keeps the terminal (and its last screen) this long: a test still waiting
# then fails on what the screen says (a traceback, the exit status), not on a terminal gone. end() stops it.
KEEP_S = 600


def own_state() -> dict[str, str]:
    """A state folder of the terminal's own: the app's journals (tokenviz.files.journal) of one test never
    meet another's (a test that kills the app leaves one, which the next start on the model would offer)."""
    return {"XDG_STATE_HOME": scratch_dir("tokenviz-terminal-state-")}


def tmux(name: str, *args: str) -> str:
    """A tmux command to the server of terminal `name`."""
    return subprocess.run(["tmux", "-L", name, *args], capture_output=True, text=True, check=True).stdout


def screen(name: str) -> str:
    return tmux(name, "capture-pane", "-p", "-t", name)


def keys(name: str, *pressed: str, pause: float = 0.3) -> None:
    for key in pressed:
        tmux(name, "send-keys", "-t", name, key)
        time.sleep(pause)


def new_session(name: str, size: tuple[int, int], command: str, env: dict, cwd: str | None = None) -> None:
    """A terminal `name` (its own tmux server) running `command`, in `cwd` if given."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed for the real-terminal tests (apt-get install tmux)")
    where = ["-c", cwd] if cwd else []
    result = subprocess.run(
        ["tmux", "-L", name, "new-session", "-d", "-s", name, *where, "-x", str(size[0]), "-y", str(size[1]), command],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise AssertionError(f"tmux could not start a session: {result.stderr.strip()}")


def end(name: str) -> None:
    """The terminal's tmux server stopped, with whatever still runs in it, and its socket file gone."""
    subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)
    folder = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
    (folder / name).unlink(missing_ok=True)


def unique_name() -> str:
    return f"tokenviz-{uuid.uuid4().hex[:8]}"


def start(size: tuple[int, int], *args: str, cwd: str | None = None, env: dict | None = None) -> str:
    """A new terminal running `tokenviz ARGS` (each argument quoted), then its exit status."""
    name = unique_name()
    quoted = " ".join(f"'{a}'" for a in args)
    command = f"{sys.executable} -m tokenviz {quoted}; echo TOKENVIZ-EXITED $?; sleep {KEEP_S}"
    new_session(name, size, command, {**os.environ, **ENV, **own_state(), **(env or {})}, cwd)
    return name


def wait_screen(name: str, pattern: str, timeout: float = 120) -> str:
    return wait_until(name, lambda text: re.search(pattern, text) is not None, repr(pattern), timeout)


def wait_until(name: str, holds: Callable[[str], bool], what: str, timeout: float = 120) -> str:
    """The screen once `holds(screen)`: a state that a pattern of one line cannot say (a wrapped line)."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = screen(name)
        if holds(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{what} never appeared; the screen was:\n{text}")


def type_into_field(name: str, text: str, tries: int = 5) -> None:
    """`text` typed into the field a dialog has just shown, until the screen shows it: the field takes the
    focus as the dialog mounts, after its words are drawn, and what is typed before is lost (seen on a
    loaded machine). Typed again only after a try has not shown in 30 s, and added to what the field holds
    (a dialog may begin it: Y's "steer "); a try that showed late would show twice and fail the test."""
    for _ in range(tries):
        tmux(name, "send-keys", "-t", name, "-l", text)
        try:
            wait_screen(name, re.escape(text), timeout=30)
            return
        except AssertionError:
            continue
    raise AssertionError(f"{text!r} typed {tries} times never showed; the screen was:\n{screen(name)}")


def wait_toast(name: str, words: str, timeout: float = 120) -> str:
    """Wait for a notification saying `words`, its wrapped lines joined (a toast's lines start with ▌)."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        lines = [line.split("▌", 1)[1].strip(" │") for line in screen(name).splitlines() if "▌" in line]
        said = re.sub(r"\s+", " ", " ".join(lines))
        if words in said:
            return said
        time.sleep(0.2)
    raise AssertionError(f"{words!r} was never said; the notifications said: {said!r}")


def wait_gone(name: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text in screen(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert text not in screen(name)


def quits_cleanly(name: str) -> None:
    """q, then the shell reports tokenviz's exit status: 0."""
    tmux(name, "send-keys", "-t", name, "q")
    assert "TOKENVIZ-EXITED 0" in wait_screen(name, r"TOKENVIZ-EXITED \d+", timeout=10)


@contextlib.contextmanager
def sessions(
    args: str, count: int, size: tuple[int, int] = (160, 48), after: str = "", cwds: list[str] | None = None
) -> Iterator[list[str]]:
    """`count` terminals running `tokenviz ARGS` at once (their start-ups overlap, which is most of a
    test's time), each followed by its exit status and `after`, each in its folder of `cwds` if given;
    all ended on the way out."""
    names = [unique_name() for _ in range(count)]
    command = f"{sys.executable} -m tokenviz {args}; echo TOKENVIZ-EXITED $?; {after}sleep {KEEP_S}"
    try:
        for i, name in enumerate(names):
            new_session(name, size, command, {**os.environ, **ENV, **own_state()}, cwds[i] if cwds else None)
        yield names
    finally:
        for name in names:
            end(name)


@contextlib.contextmanager
def terminal(size: tuple[int, int], *args: str, cwd: str | None = None, env: dict | None = None) -> Iterator[str]:
    """start(), ended on the way out."""
    name = start(size, *args, cwd=cwd, env=env)
    try:
        yield name
    finally:
        end(name)


def tokenviz_pid(name: str) -> str:
    shell = tmux(name, "display", "-p", "-t", name, "#{pane_pid}").strip()
    return subprocess.run(["pgrep", "-P", shell, "-f", "tokenviz"], capture_output=True, text=True).stdout.split()[0]


def terminal_modes(name: str) -> dict[str, str]:
    """What the program in the terminal has turned on: the alternate screen, the mouse reported, the cursor
    shown (tmux's own flags: "1" on, "0" off)."""
    flags = ("alternate_on", "mouse_any_flag", "mouse_button_flag", "mouse_sgr_flag", "cursor_flag")
    shown = tmux(name, "display", "-p", "-t", name, " ".join(f"#{{{flag}}}" for flag in flags)).split()
    return dict(zip(flags, shown))


def given_back(name: str, timeout: float = 30) -> dict[str, str]:
    """Wait for the terminal to be as a shell wants it (the main screen, no mouse reported, the cursor
    shown); its modes then."""
    deadline, modes = time.monotonic() + timeout, {}
    sane = {"alternate_on": "0", "mouse_any_flag": "0", "mouse_button_flag": "0", "mouse_sgr_flag": "0"}
    while time.monotonic() < deadline:
        modes = terminal_modes(name)
        if all(modes.get(flag) == value for flag, value in sane.items()) and modes.get("cursor_flag") == "1":
            return modes
        time.sleep(0.2)
    raise AssertionError(f"the terminal was never given back: {modes}; the screen was:\n{screen(name)}")


def at_each_size(check: Callable[[str, tuple[int, int]], None], *args: str, env: dict | None = None) -> None:
    """`tokenviz ARGS` in a terminal at each of SIZES at once (their start-ups overlap), `check(name,
    size)` driving and reading each in a thread of its own; a failure is raised naming its size."""
    names: dict[tuple[int, int], str] = {}
    try:
        for size in SIZES:
            names[size] = start(size, *args, env=env)
        with ThreadPoolExecutor(len(SIZES)) as pool:
            done = {size: pool.submit(check, name, size) for size, name in names.items()}
        for (width, height), future in done.items():
            try:
                future.result()
            except AssertionError as exc:
                raise AssertionError(f"at {width}x{height}: {exc}") from exc
    finally:
        for name in names.values():
            end(name)


def dialog_text(text: str) -> str:
    """What a dialog drawn over the panes says, its lines joined and its wrapping undone: each line's
    part between the dialog's borders (█), the panes either side left out."""
    inside = [line.split("█")[1] for line in text.splitlines() if line.count("█") >= 2]
    return re.sub(r"\s+", " ", re.sub("[▁-▇]", " ", " ".join(inside)))  # (a scroll bar's blocks left out)


def pane_text(text: str, title: str) -> str:
    """What the pane whose border's title begins `title` (`─ model `) shows, its lines joined and its wrapping
    undone: each line's part between the pane's borders, the panes beside it left out."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if title in line)
    left = lines[top].rindex("╭", 0, lines[top].index(title) + 1)
    right = lines[top].index("╮", left)
    inside = []
    for line in lines[top + 1 :]:
        if line[left : left + 1] == "╰":
            break
        inside.append(line[left + 1 : right])
    return re.sub(r"\s+", " ", re.sub("[▁-▇█]", " ", " ".join(inside))).strip()  # (a scroll bar left out)
