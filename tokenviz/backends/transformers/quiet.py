"""transformers' own output kept off the terminal the TUI owns, and an error told in one line."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator


def one_line(exc: BaseException) -> str:
    """The first line of what an error says (its name where it says nothing)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers and tqdm print warnings and bars to the terminal the TUI owns."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stderr(io.StringIO()):
                yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()
