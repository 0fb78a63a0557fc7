"""A safetensors file's header, read with bounds before the safetensors library is handed the file.

The format is 8 bytes of header length, the header as JSON ({name: {dtype, shape, data_offsets}}),
then the data. A hostile file may claim a header of a gigabyte, offsets past its end, a shape whose
size its offsets do not hold, or a tensor larger than the memory it would be read into; each is
refused here in one line, so a tensor is read only once its size and shape are known to be what the
caller expects.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.reading import OPEN_FLAGS, parse_json

MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
ITEM_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * ITEM_BYTES[self.dtype]


def read_header(path: Path, what: str) -> dict[str, TensorEntry]:
    """Each tensor's dtype and shape in the safetensors file at `path`, every entry checked against the
    file: its offsets within the data, and as many bytes as its shape and dtype need."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {what}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise ModelLoadError(f"{what} is not a regular file: refused")
        length_bytes = file.read(8)
        if len(length_bytes) < 8:
            raise ModelLoadError(f"{what} is not a safetensors file (shorter than its header's length)")
        (length,) = struct.unpack("<Q", length_bytes)
        if length > min(MAX_HEADER_BYTES, status.st_size - 8):
            raise ModelLoadError(
                f"{what} claims a header of {length:,} bytes, past the file or the {MAX_HEADER_BYTES >> 20} MB a "
                "header may be: not a safetensors file, or a damaged one"
            )
        header = parse_json(file.read(length), what, ModelLoadError, finite=True)
    data_bytes = status.st_size - 8 - length
    if not isinstance(header, dict):
        raise ModelLoadError(f"{what}'s header is not a table of tensors")
    entries: dict[str, TensorEntry] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(name, entry, data_bytes, what)
    return entries


def _entry(name: str, entry: object, data_bytes: int, what: str) -> TensorEntry:
    shown = safe_text(shortened(name, 80))
    if not isinstance(entry, dict):
        raise ModelLoadError(f"{what}'s header entry {shown} is not a tensor")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEM_BYTES:
        raise ModelLoadError(f"{what}'s tensor {shown} has a dtype safetensors does not define")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ModelLoadError(f"{what}'s tensor {shown} has no shape of counts")
    if (
        not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets))
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise ModelLoadError(f"{what}'s tensor {shown} lies past the end of the file")
    tensor = TensorEntry(str(dtype), tuple(shape))
    if offsets[1] - offsets[0] != tensor.bytes:
        raise ModelLoadError(
            f"{what}'s tensor {shown} holds {offsets[1] - offsets[0]:,} bytes where its shape needs {tensor.bytes:,}"
        )
    return tensor
