"""Running native code that recurses as deep as its input nests (llguidance compiles a grammar's rules
recursively) on a thread whose stack holds what the input's bounds allow: with the 8 MB a thread has
by default, a chain of 3,000 grammar rules overflowed it and the process died of SIGSEGV."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from tokenviz.contract.errors import TokenvizError

T = TypeVar("T")

DEEP_STACK_BYTES = 256 << 20  # address space reserved, not memory used: pages are touched as the recursion goes
_sizing = threading.Lock()  # threading.stack_size is process-wide: set, start, restore under one lock


def on_deep_stack(work: Callable[[], T], what: str) -> T:
    """`work()` on a thread of its own with a DEEP_STACK_BYTES stack; its result, or its exception.
    `what` names the work in the one line said where no such thread can be made."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:  # handed to the caller's thread as it was
            failure.append(exc)

    with _sizing:
        previous = threading.stack_size(DEEP_STACK_BYTES)
        try:
            thread = threading.Thread(target=run, name="tokenviz-deep-stack", daemon=True)
            thread.start()
        except RuntimeError:  # no room for the stack (an address-space limit): refused, never run shallow
            raise TokenvizError(f"there is no memory for the stack {what} needs") from None
        finally:
            threading.stack_size(previous)
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]
