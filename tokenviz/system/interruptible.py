"""Stopping a long call part way that has no points to ask "cancelled?" between (torch.compile's
warm-up: tracing, code generation and compiling, minutes for a large model on a GPU).

The thread running it marks the call as a section that may be interrupted; another thread (the UI's,
on Escape) interrupts it there by raising `Interrupted` in it, as CPython lets one thread do to
another (PyThreadState_SetAsyncExc). The exception lands at the thread's next Python instruction, so
a call into native code (one file being compiled) finishes first. It is a BaseException, as
KeyboardInterrupt is, so the `except Exception` of the code interrupted does not swallow it. Outside
a section nothing is ever raised: an interrupt that comes as the section ends is taken back.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(BaseException):
    """Raised in a thread inside an interruptible section by `interrupt`."""


_lock = threading.Lock()
_inside: dict[int, bool] = {}  # thread id -> whether an interrupt has been sent into its section


def _set_async(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in the thread at its next instruction (None: take back one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, `interrupt` from another thread raises Interrupted in this one (sections do not nest)."""
    me = threading.get_ident()
    with _lock:
        _inside[me] = False
    try:
        yield
    finally:
        with _lock:
            sent = _inside.pop(me)
            if sent:  # raised already, or still pending: taken back, so nothing lands after the section
                _set_async(me, None)
    if sent:  # it came as the section's work ended: still the user's choice
        raise Interrupted


def interrupt(thread: threading.Thread) -> bool:
    """Interrupt `thread` if it is inside an interruptible section (once); True if it was."""
    with _lock:
        if thread.ident is None or _inside.get(thread.ident, True):
            return False
        _inside[thread.ident] = True
        _set_async(thread.ident, Interrupted)
        return True


def inside(thread: threading.Thread) -> bool:
    """Whether `thread` is inside an interruptible section now."""
    with _lock:
        return thread.ident in _inside
