"""The terminal given back when the app's process dies where no Python runs: a fault inside llama.cpp
(SIGSEGV, an abort), or SIGKILL. Textual would leave the terminal in its alternate screen, reporting the
mouse, echoing nothing, with whatever the native code printed drawn over the frame.

A small watcher process starts with the app and waits on a pipe the app holds. An app that quits says
so on the pipe first; a pipe that closes without that means the process died, and the watcher puts the
terminal back (the main screen, the mouse, the cursor and the line settings as they were when it
started) and says in one line what happened and that the journey's journal is kept. This costs a
process of about 10 MB that waits and nothing while the app runs (bench: `terminal_guard`); it was
chosen over running llama.cpp in a child process, which would copy every logit row and every capture
across processes on every step.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import termios

QUIT = b"quit"  # what an app that quits says on the pipe before it closes
# What Textual turns on, turned off: mouse reporting (all its modes), bracketed paste, focus events, the
# kitty keyboard protocol, synchronized output; what it turns off, on: lines that wrap, the cursor; then
# the main screen back.
RESTORE = (
    b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1015l\x1b[?2004l\x1b[?1004l\x1b[<u\x1b[?2026l"
    b"\x1b[?7h\x1b[?25h\x1b[?1049l"
)
SAID = (
    "tokenviz ended without quitting (a crash inside its model's runtime, or a kill): the terminal is "
    "restored; the journey's journal is kept, and `tokenviz --restore` takes it again\n"
)
_pipes: list[int] = []  # the write end the app holds while it runs


def guard_terminal() -> None:
    """Start the watcher for this process's terminal (stdout must be one); `release` before an orderly end
    (it is registered to run at exit)."""
    if _pipes or not os.isatty(sys.stdout.fileno()):
        return
    read, write = os.pipe()
    try:
        subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=read,
            start_new_session=True,  # ctrl+c and a closed terminal's SIGHUP reach the app alone
            close_fds=True,
        )
    except OSError:
        os.close(write)
        return  # no process to be had: the app runs unguarded, as before
    finally:
        os.close(read)
    _pipes.append(write)
    atexit.register(release)


def release() -> None:
    """The app ends in order (its own exit restores the terminal): the watcher ends without a word."""
    while _pipes:
        write = _pipes.pop()
        with contextlib.suppress(OSError):
            os.write(write, QUIT)
        with contextlib.suppress(OSError):
            os.close(write)


def watch() -> None:
    """The watcher: wait for the pipe on stdin to close; unless the app said it quit, restore stdout's
    terminal and say so on stderr."""
    for quiet in (signal.SIGINT, signal.SIGHUP, signal.SIGTTOU, signal.SIGTSTP):
        signal.signal(quiet, signal.SIG_IGN)  # SIGTTOU: the line settings are set from outside the foreground
    terminal = sys.stdout.fileno()
    try:
        saved = termios.tcgetattr(terminal)
    except termios.error:
        saved = None
    said = b""
    while chunk := os.read(sys.stdin.fileno(), 64):
        said = (said + chunk)[-len(QUIT) :]
    if said == QUIT:
        return
    with contextlib.suppress(OSError, termios.error):
        os.write(terminal, RESTORE)
        if saved is not None:
            termios.tcsetattr(terminal, termios.TCSADRAIN, saved)
        os.write(sys.stderr.fileno(), SAID.encode())


if __name__ == "__main__":
    watch()
