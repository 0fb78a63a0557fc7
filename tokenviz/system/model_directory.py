"""A model directory the user names, checked before any library opens a file of it: transformers,
tokenizers and safetensors open what they find by name and block on a FIFO, follow a link to a device,
or parse a 700 MB tokenizer.json whole. Every entry is looked at without opening it (its kind and size,
through a link); anything but a regular file or a folder is refused by name, and so is a file of text
(a config, a tokenizer's files, an index) larger than any real model's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.reading import size_text

MAX_TEXT_FILE_BYTES = 128 << 20  # a config or tokenizer file (Gemma 3's tokenizer.json: 33 MB)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".msgpack", ".h5")
MAX_ENTRIES = 100_000  # entries looked at in one directory


def check_model_directory(directory: Path, what: str) -> None:
    """Refuse, in one line naming `what` and the entry, a directory holding an entry that is not a
    regular file or a folder (a FIFO, a socket, a device, a link to one or a dangling link), or a file of
    text over MAX_TEXT_FILE_BYTES. Weights may be any size: their headers are read with bounds."""
    try:
        entries = os.scandir(directory)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {what}: {exc.strerror or exc}") from None
    with entries:
        for count, entry in enumerate(entries, 1):
            if count > MAX_ENTRIES:
                raise ModelLoadError(f"{what} holds more than {MAX_ENTRIES:,} entries: not a model directory")
            name = safe_text(shortened(entry.name, 80))
            try:
                status = entry.stat(follow_symlinks=True)
            except OSError:
                raise ModelLoadError(f"{what}: {name} is a link to nothing, or cannot be read") from None
            if stat.S_ISDIR(status.st_mode):
                continue
            if not stat.S_ISREG(status.st_mode):
                raise ModelLoadError(f"{what}: {name} is not a regular file (a FIFO, a device or a socket): refused")
            if not entry.name.endswith(WEIGHT_SUFFIXES) and status.st_size > MAX_TEXT_FILE_BYTES:
                raise ModelLoadError(
                    f"{what}: {name} is {size_text(status.st_size)}, larger than the "
                    f"{size_text(MAX_TEXT_FILE_BYTES)} any model's config or tokenizer file is"
                )
