"""The app in this terminal: the check that there is one to draw in, the run, and the exit code."""

import atexit
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from tokenviz.cli.commands.common import in_a_browser
from tokenviz.cli.options import fail, print_error
from tokenviz.system.terminal_guard import guard_terminal

if TYPE_CHECKING:
    from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot
    from tokenviz.contract.worker import Worker

QUIT_WAIT_S = 0.1  # how long quitting waits for the engine thread; exit_now then ends it mid-pass


def require_terminal(headless: str = "tokenviz trace PROMPT --json") -> None:
    """The app draws full-screen: refuse, in one line, where it cannot, naming the command's own form for
    a script (`headless`)."""
    if in_a_browser():
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(f"tokenviz needs a terminal on stdin and stdout; for scripts use: {headless}")
    if os.environ.get("TERM") == "dumb":
        fail(f"TERM=dumb cannot draw the app; use a full terminal, or: {headless}")


def can_draw() -> bool:
    """Whether the app can draw here (see require_terminal): a command with a headless form takes it elsewhere."""
    terminal = sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    return in_a_browser() or terminal


def run_app(worker: "Worker[Snapshot] | Worker[ComparisonSnapshot]", theme: str, comparing: bool = False) -> NoReturn:
    """Run the app on `worker` until it quits, then end the process once the writes asked for are
    done: exit 128 + N after signal N, 2 with the error's line when the model could not load, 1
    after an error the app did not handle, 0 otherwise."""
    from tokenviz.ui.app import TokenvizApp

    app = TokenvizApp(worker, theme=theme, comparing=comparing)
    if not in_a_browser():
        guard_terminal()  # the terminal given back should the process die where no Python runs
    app.run()
    for failure in app.finish(quit_wait_s=QUIT_WAIT_S):
        print_error(failure)
    if app.fatal_error:
        print_error(app.fatal_error)
    if app.signalled is not None:
        if app.signalled != signal.SIGINT:  # SIGTERM, SIGHUP: not the user's quitting, so not its journey's end
            from tokenviz.worker.journaling import keep_journals

            keep_journals()
        exit_now(128 + app.signalled)
    exit_now(2 if app.fatal_error else app.return_code or 0)  # an unhandled error: Textual's 1, not 0


def exit_now(code: int) -> NoReturn:
    """End the app's process once the terminal is restored and the exit handlers have run.

    Python's own shutdown would then spend about a second tearing down torch's modules, and it
    aborts the process if the engine thread is still inside a forward pass (a model loading).
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
