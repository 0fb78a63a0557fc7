"""Stopping a long call part way that has no points to ask "cancelled?" between (torch.compile's
warm-up: tracing, code generation and compiling, minutes for a large model on a GPU).

The thread running it marks the call as a section that may be interrupted; another thread (the UI's,
on Escape) interrupts it there by raising `Interrupted` in it, as CPython lets one thread do to
another (PyThreadState_SetAsyncExc). The exception lands at the thread's next Python instruction, so
a call into native code (one file being compiled) finishes first. It is a BaseException, as
KeyboardInterrupt is, so the `except Exception` of the code interrupted does not swallow it. Outside
a section nothing is ever raised: an interrupt that comes as the section ends is taken back.

An exception that lands where Python ignores exceptions (a garbage collector's callback or a `__del__`
that the section's thread happens to run: "Exception ignored in ...") is lost; the section would then run
to its end, however long. So an interrupt is sent again every RESEND_S until the thread has left it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(BaseException):
    """Raised in a thread inside an interruptible section by `interrupt`."""


RESEND_S = 0.5  # an interrupt not yet taken is sent again this often (see above)

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
    _send_again_later(thread.ident)
    return True


def _send_again_later(thread_id: int) -> None:
    """Interrupted sent again in RESEND_S, and after, while the thread is still inside its section (it
    takes back what is pending as it leaves, under the same lock)."""

    def again() -> None:
        with _lock:
            if not _inside.get(thread_id):
                return
            _set_async(thread_id, Interrupted)
        _send_again_later(thread_id)

    timer = threading.Timer(RESEND_S, again)
    timer.daemon = True
    timer.start()


def inside(thread: threading.Thread) -> bool:
    """Whether `thread` is inside an interruptible section now."""
    with _lock:
        return thread.ident in _inside
