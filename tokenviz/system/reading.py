"""Reading a file the user names, whatever it turns out to be: it is opened without blocking (a FIFO
or a device never holds the program), refused unless it is a regular file, and refused by its size
before a byte is read. JSON read from such a file is refused in one line when it nests too deeply for
the parser."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.text import safe_text

OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def size_text(size: int) -> str:
    """A file's size as people read it: bytes (to the byte, below 10 MB), else MB."""
    return f"{size:,} bytes" if size < 10_000_000 else f"{size / 1e6:,.0f} MB"


def read_file(path: str | Path, limit: int, what: str, error: type[TokenvizError] = SettingsError) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them; one line naming `what` (as
    "the JSON schema x.json") otherwise. Nothing blocks: a FIFO, a socket, a device or a directory is
    refused before it is read."""
    try:
        fd = os.open(Path(path).expanduser(), OPEN_FLAGS)
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):  # (before fdopen, which refuses a directory with a traceback)
        os.close(fd)
        raise error(f"{what} is {'a directory' if stat.S_ISDIR(status.st_mode) else 'not a regular file'}")
    with os.fdopen(fd, "rb") as file:
        if status.st_size > limit:
            raise error(f"{what} is {size_text(status.st_size)}: larger than the {size_text(limit)} tokenviz reads")
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise error(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:  # (it grew since)
        raise error(f"{what} is larger than the {size_text(limit)} tokenviz reads")
    return data


def parse_json(text: str | bytes, what: str, error: type[TokenvizError] = SettingsError, finite: bool = False) -> Any:
    """`text` as JSON; one line naming `what` where it is not, or nests deeper than the parser goes, or
    (with `finite`) holds NaN or Infinity, which Python's parser takes and JSON does not."""

    def not_finite(name: str) -> Any:
        raise ValueError(f"{name} is not a number")

    try:
        return json.loads(text, parse_constant=not_finite if finite else None)
    except RecursionError:
        raise error(f"{what} nests too deeply to be read") from None
    except UnicodeDecodeError:
        raise error(f"{what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # beyond JSON's grammar: a 5,000-digit integer, say
        raise error(f"{what} cannot be read: {safe_text(str(exc).split(';')[0])}") from None
