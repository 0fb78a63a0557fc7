"""A wait the user would otherwise sit through in silence: once it has lasted SAID_AFTER_S, the status line
says what the engine thread is doing, how far it is where that is known, and for how long, again every
SAID_AFTER_S until it is done. Said from a timer's thread through the worker's last frame (its journey
unchanged, so no view asks again); the frame after the work replaces it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tokenviz.render.units import duration

SAID_AFTER_S = 1.0  # a wait shorter than this says nothing: it would flicker past unread

Say = Callable[[str, str], None]  # (the line, the view it computes or "") -> the frame that says it


class Meanwhile:
    """What the engine thread is doing now, said while it lasts (see the module's docstring)."""

    def __init__(self, say: Say) -> None:
        self._say = say
        self._inside = False  # a wait is being said (the engine thread's alone: no lock)

    @contextmanager
    def saying(self, what: str, unit: str = "", view: str = "") -> Iterator[Callable[[int, int], None]]:
        """Inside, a wait of `what`; the callback yielded tells how far it is (done, total) in `unit`s.
        `view`: the view whose result is being computed (its pane says so), or "". A wait inside another
        (the standing lens's request inside the views' settling) is the outer one's to say."""
        if self._inside:
            yield lambda done, total: None
            return
        self._inside = True
        started, done = time.monotonic(), threading.Event()
        far: list[tuple[int, int]] = []

        def line() -> str:
            where = f": {far[-1][0]:,} of {far[-1][1]:,}{unit}" if far else ""
            return f"{what}{where} · {duration(time.monotonic() - started)}"

        def tell() -> None:
            while not done.wait(SAID_AFTER_S):
                self._say(line(), view)

        teller = threading.Thread(target=tell, name="tokenviz-meanwhile", daemon=True)
        teller.start()
        try:
            yield lambda n, total: far.append((n, total))
        finally:
            done.set()
            teller.join()
            self._inside = False
