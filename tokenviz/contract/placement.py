"""Where a model's weights may go and how much each device may hold: `--max-memory DEVICE=SIZE`.
Plain and validated, free of torch, so a mistake is refused before anything heavy is imported."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenviz.contract.errors import SettingsError

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
_DEVICE = re.compile(r"^(cpu|disk|mps|cuda(:\d+)?|\d+)$")


def size_bytes(text: str) -> int:
    """'20GB' (powers of 10), '8GiB' (powers of 2), '512MB', '1000' (bytes)."""
    match = _SIZE.match(text)
    if not match:
        raise SettingsError(f"{text!r} is not a size: write it as 20GB, 8GiB or 512MB")
    return int(float(match.group(1)) * UNITS[(match.group(2) or "").upper()])


def max_memory(entries: Iterable[str]) -> dict[str, int]:
    """`--max-memory` entries as {device: bytes}: 'cuda:0=20GB' (a bare GPU number means cuda:N)."""
    limits: dict[str, int] = {}
    for entry in entries:
        device, sep, size = entry.partition("=")
        device = device.strip().lower()
        if not sep or not _DEVICE.match(device):
            raise SettingsError(f"--max-memory {entry!r}: write DEVICE=SIZE, as cpu=8GB or cuda:0=20GB")
        limits[f"cuda:{device}" if device.isdigit() else device] = size_bytes(size)
    return limits
