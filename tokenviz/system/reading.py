"""Reading a file the user names, whatever it turns out to be: it is opened without blocking (a FIFO
or a device never holds the program), refused unless it is a regular file, and refused by its size
before a byte is read. JSON read from such a file is refused in one line when it nests too deeply for
the parser."""

from __future__ import annotations

import json
import math
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
    if not stat.S_ISREG(status.st_mode):  # before fdopen, which refuses a directory with a traceback
        os.close(fd)
        raise error(f"{what} is {'a directory' if stat.S_ISDIR(status.st_mode) else 'not a regular file'}")
    with os.fdopen(fd, "rb") as file:
        if status.st_size > limit:
            raise error(f"{what} is {size_text(status.st_size)}: larger than the {size_text(limit)} tokenviz reads")
        try:
            data = file.read(limit + 1)
        except OSError as exc:
            raise error(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > limit:  # it grew since
        raise error(f"{what} is larger than the {size_text(limit)} tokenviz reads")
    return data


MAX_INTEGER_DIGITS = 19  # an integer a server may send (a count, an id, a rank): within 64 bits


def parse_json(text: str | bytes, what: str, error: type[TokenvizError] = SettingsError, finite: bool = False) -> Any:
    """`text` as JSON; one line naming `what` where it is not, or nests deeper than the parser goes, or
    (with `finite`) holds a number no float holds: NaN or Infinity (which Python's parser takes and JSON
    does not), a number past a float's range (1e400) or an integer of more than MAX_INTEGER_DIGITS digits
    (which Python holds exactly and a float conversion then refuses with a traceback)."""

    def not_finite(name: str) -> Any:
        raise ValueError(f"{name} is not a number")

    def real(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"the number {literal[:24]} is past a float's range")
        return value

    def integer(literal: str) -> int:
        digits = len(literal.lstrip("-"))
        if digits > MAX_INTEGER_DIGITS:
            raise ValueError(f"an integer of {digits} digits is past any count or id")
        return int(literal)

    hooks: dict[str, Any] = {"parse_constant": not_finite, "parse_float": real, "parse_int": integer} if finite else {}
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise error(f"{what} nests too deeply to be read") from None
    except UnicodeDecodeError:
        raise error(f"{what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # beyond JSON's grammar: a 5,000-digit integer, say
        raise error(f"{what} cannot be read: {safe_text(str(exc).split(';')[0])}") from None
