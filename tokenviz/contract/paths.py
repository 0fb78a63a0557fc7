"""Where tokenviz keeps its files: converted models and the error log."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$XDG_CACHE_HOME/tokenviz, or ~/.cache/tokenviz."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tokenviz"
