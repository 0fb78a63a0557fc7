"""The error log: the full details of an unforeseen error, while the app shows one line."""

from __future__ import annotations

import traceback
from pathlib import Path

from tokenviz.system.paths import cache_root


def log_path() -> Path:
    return cache_root() / "tokenviz.log"


MAX_LOG_BYTES = 1 << 20  # past this the log starts afresh, keeping the previous one as tokenviz.log.1


def log_exception() -> str:
    """Append the exception being handled to the log; returns the one line to show for it."""
    try:
        path = log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        with path.open("a") as f:
            f.write(traceback.format_exc() + "\n")
    except OSError:
        return "details could not be written to the log"
    return f"details in {path}"
