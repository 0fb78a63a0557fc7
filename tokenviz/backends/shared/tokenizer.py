"""A Hugging Face tokenizer alone, from an id or a model directory (a served model's, to tokenize with here),
its directory's files looked at first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import safe_text
from tokenviz.system.model_directory import check_model_directory


def load_tokenizer(source: str) -> Any:
    """A tokenizer alone (a Hugging Face id or directory): a served model's, to tokenize with here. One
    line where it cannot load."""
    from transformers import AutoTokenizer

    directory = Path(source).expanduser()
    if directory.is_dir():  # its files looked at before any is opened: a FIFO there would block
        check_model_directory(directory, f"--tokenizer {safe_text(source)}")
    try:
        return AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # the user's files: whatever they make transformers or tokenizers raise
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load the tokenizer {safe_text(source)}: {safe_text(said)[:200]}") from None
