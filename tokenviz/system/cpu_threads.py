"""How many CPU threads a computation may take: the cores this process may run on, OMP_NUM_THREADS where
it is set, and never more than a small multiple of the cores. ggml and OpenMP start every thread asked
for: 100,000 of them ended llama.cpp in std::bad_alloc, and from 600 on libgomp could not create them."""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping

THREADS_A_CORE = 4  # the most threads a core may be asked to run (more only wait on one another)
SETTING = "OMP_NUM_THREADS"


def cores() -> int:
    """The cores this process may run on (a container's or taskset's limit counted)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return max(1, len(allowed) if allowed else os.cpu_count() or 1)


def most_threads() -> int:
    return THREADS_A_CORE * cores()


def too_many(threads: int) -> str | None:
    """Why `threads` is more than this machine can run, or None."""
    if threads <= most_threads():
        return None
    return f"this machine runs at most {most_threads():,} ({THREADS_A_CORE} a core, {cores()} cores)"


def _whole(text: str) -> int | None:
    """`text` as a whole number from 1 (digits of ASCII alone: "²" is a digit, not a number), or None."""
    text = text.strip()
    if not (text.isascii() and text.isdecimal()):
        return None
    digits = text.lstrip("0")
    if not digits:
        return None
    return int(digits) if len(digits) < 19 else 1 << 62  # more digits: more threads than any machine runs


def told_threads(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """The threads OMP_NUM_THREADS asks for where it is a whole number this machine can run, else None."""
    threads = _whole(environ.get(SETTING, ""))
    return threads if threads is not None and too_many(threads) is None else None


def tidy_thread_setting(warn: Callable[[str], None], environ: MutableMapping[str, str] = os.environ) -> None:
    """Take out an OMP_NUM_THREADS that is not a number of threads this machine can run, with one line,
    before torch or llama.cpp reads it (OpenMP reads it as its library loads)."""
    told = environ.get(SETTING)
    if told is None or told_threads(environ) is not None:
        return
    del environ[SETTING]
    threads = _whole(told)
    why = too_many(threads) if threads is not None else "not a whole number of threads from 1"
    warn(f"{SETTING}={ascii(told[:20])[1:-1]} is ignored: {why}")
