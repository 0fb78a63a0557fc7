"""A GGUF file's header, read with bounds before llama.cpp is handed the file: a header that lies (counts
past what the file can hold, a string of gigabytes, a vocabulary of a billion, a tensor past the end, a
type llama.cpp does not know) is one line, read in a moment with a little memory, where llama.cpp could
allocate what the header claims or read past its mapping.

The layout (llama.cpp's docs/gguf.md): "GGUF", a version (2 or 3), the tensor count and the metadata
count (64-bit), the metadata (a key, a type, a value; arrays of any type but arrays), each tensor's
name, dimensions, type and offset, then the data from the next multiple of general.alignment.
"""

from __future__ import annotations

import collections
import functools
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.files.gguf_hyperparameters import check_hyperparameters

MAX_TENSORS = 1 << 16  # the largest models hold a few thousand
MAX_METADATA = 1 << 16
MAX_ARRAY = 1 << 24  # entries of one metadata array (a vocabulary of 16 million tokens)
MAX_STRING = 1 << 24  # bytes of one string (a chat template is kilobytes)
MAX_DIMS = 4
SHORT = 256  # a string kept (general.architecture); longer ones are read past
SHORT_LIST = 1024  # a list of numbers kept (a count a layer: expert_used_count); longer ones are read past
# ggml's types that are never a weight's (what a product's other side is quantized to, indices, doubles):
# llama.cpp has no kernel that multiplies by them, and ended in a segmentation fault on one
NO_WEIGHT_TYPES = frozenset({"Q8_1", "Q8_K", "I8", "I16", "I32", "I64", "F64"})


@dataclass(frozen=True)
class GgufHeader:
    version: int
    tensors: int
    metadata: int
    data_start: int  # where the tensors' data begins
    data_bytes: int  # what the tensors' data takes, by their shapes and types
    numbers: dict[str, float]  # the metadata's numbers by key (block_count, head counts...)
    strings: dict[str, str]  # its short strings by key (general.architecture...)
    lists: dict[str, tuple[float, ...]] = field(default_factory=dict)  # its short lists of numbers by key
    tensor_types: dict[str, int] = field(default_factory=dict)  # how many tensors of each type, most first
    tensor_names: frozenset[str] = frozenset()  # whether it has an output head of its own: output.weight

    def number(self, *keys: str) -> int | None:
        """The first of `keys` the metadata holds, as a whole number."""
        found = (self.numbers[k] for k in keys if k in self.numbers)
        return next((int(v) for v in found if math.isfinite(v) and 0 <= v < 1 << 62), None)

    def file_type(self) -> str | None:
        """The file's type as people name it (general.file_type: Q4_K_M, Q8_0, F16), or None where it says
        none a name is known for."""
        from gguf import LlamaFileType

        number = self.number("general.file_type")
        known = next((t for t in LlamaFileType if t.value == number and t.name != "GUESSED"), None)
        return None if known is None else known.name.removeprefix("MOSTLY_").removeprefix("ALL_")

    def types_said(self, most: int = 6) -> str:
        """Its tensors' types with their counts, most first ("140 Q4_K, 31 Q6_K, 61 F32"): what a K-quant
        file falls back to on narrow rows shows here."""
        shown = [f"{count} {name}" for name, count in list(self.tensor_types.items())[:most]]
        rest = sum(list(self.tensor_types.values())[most:])
        return ", ".join(shown + ([f"{rest} more"] if rest else []))


@functools.cache
def value_types() -> tuple[dict[int, np.dtype[Any]], int, int]:
    """The gguf package's own tables of the metadata's value types: each number type's numpy type (its
    size and how it reads, little-endian), and the string and array types' numbers. (Imported when a
    file is read: the command line imports this module before anything loads.)"""
    from gguf import GGUFValueType
    from gguf.gguf_reader import GGUFReader

    numbers = {int(t): np.dtype(d).newbyteorder("<") for t, d in GGUFReader.gguf_scalar_to_np.items()}
    return numbers, int(GGUFValueType.STRING), int(GGUFValueType.ARRAY)


def _shown(name: bytes) -> str:
    """A name from the file, safe to print."""
    return safe_text(shortened(name.decode("utf-8", "replace"), 40))


class _Reader:
    def __init__(self, file: BinaryIO, size: int, name: str):
        self.file, self.size, self.name = file, size, name

    def lie(self, what: str) -> TokenvizError:
        return TokenvizError(f"{self.name} is not a GGUF llama.cpp can read: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.file.tell():
            raise self.lie(f"{what} runs past the end of the file")
        return self.file.read(n)

    def number(self, fmt: str, what: str) -> int:
        return int(struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0])

    def string(self, what: str) -> bytes:
        n = self.number("Q", what)
        if n > MAX_STRING:
            raise self.lie(f"{what} claims {n:,} bytes")
        return self.take(n, what)

    def skip_value(self, kind: int, what: str) -> float | str | tuple[float, ...] | None:
        """Read past one value of `kind`; a number's value, a short string's or a short list of numbers' is
        returned."""
        numbers, string, array = value_types()
        if kind in numbers:
            return float(np.frombuffer(self.take(numbers[kind].itemsize, what), numbers[kind])[0])
        if kind == string:
            text = self.string(what)
            return _shown(text) if len(text) <= SHORT else None
        if kind == array:
            inner, count = self.number("I", what), self.number("Q", what)
            if count > MAX_ARRAY:
                raise self.lie(f"{what} claims {count:,} entries")
            if inner in numbers:
                data = self.take(count * numbers[inner].itemsize, what)
                if count <= SHORT_LIST:
                    return tuple(float(v) for v in np.frombuffer(data, numbers[inner]))
            elif inner == string:
                for _ in range(count):
                    self.string(what)
            else:
                raise self.lie(f"{what} is an array of type {inner}")
            return None
        raise self.lie(f"{what} has the unknown type {kind}")


def _tensor_end(r: _Reader, i: int, alignment: int) -> tuple[int, str, str]:
    """Read tensor `i`'s entry: where its data ends, counted from the data's start, its type's name and its
    own name."""
    name = _shown(r.string(f"tensor {i}'s name"))
    dims = r.number("I", f"tensor {name!r}'s dimensions")
    if not 0 < dims <= MAX_DIMS:
        raise r.lie(f"tensor {name!r} has {dims} dimensions")
    shape = [r.number("Q", f"tensor {name!r}'s shape") for _ in range(dims)]
    kind, offset = r.number("I", f"tensor {name!r}'s type"), r.number("Q", f"tensor {name!r}")
    from gguf import GGML_QUANT_SIZES  # here: the command line imports this module before anything loads

    known = next((t for t in GGML_QUANT_SIZES if int(t) == kind), None)
    if known is None:
        raise r.lie(f"tensor {name!r} has the unknown type {kind}")
    if known.name in NO_WEIGHT_TYPES:
        raise r.lie(f"tensor {name!r} is of type {known.name}, which llama.cpp computes no weight in")
    if dims == 1 and known.name != "F32":  # ggml's binary operations on a CPU: an abort at the first step
        raise r.lie(f"tensor {name!r} is a vector (a norm's, a bias's) in {known.name}: llama.cpp takes those in F32")
    sizes = GGML_QUANT_SIZES[known]
    elements = 1
    for n in shape:
        elements *= n
    block, block_bytes = sizes
    if shape[0] % block or offset % alignment:
        raise r.lie(f"tensor {name!r}'s shape or offset does not fit its type's blocks")
    return offset + elements // block * block_bytes, known.name, name


def read_gguf_header(path: Path) -> GgufHeader:
    """The header of the GGUF at `path`, every count and offset checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as file:
        r = _Reader(file, size, safe_text(shortened(path.name, 60)))
        if r.take(4, "the magic") != b"GGUF":
            raise r.lie("it does not start with GGUF")
        version = r.number("I", "the version")
        if version not in (2, 3):
            raise r.lie(f"version {version} (llama.cpp reads 2 and 3)")
        tensors, metadata = r.number("Q", "the tensor count"), r.number("Q", "the metadata count")
        if tensors > MAX_TENSORS or metadata > MAX_METADATA:
            raise r.lie(f"it claims {tensors:,} tensors and {metadata:,} metadata entries")
        numbers: dict[str, float] = {}
        strings: dict[str, str] = {}
        lists: dict[str, tuple[float, ...]] = {}
        for i in range(metadata):
            key = r.string(f"metadata key {i}")
            value = r.skip_value(r.number("I", f"metadata {i}'s type"), f"metadata {_shown(key)!r}")
            if isinstance(value, float):
                numbers[key.decode("utf-8", "replace")] = value
            elif isinstance(value, str):
                strings[key.decode("utf-8", "replace")] = value
            elif isinstance(value, tuple):
                lists[key.decode("utf-8", "replace")] = value
        asked = numbers.get("general.alignment", 32.0)
        alignment = int(asked) if math.isfinite(asked) and 0 < asked <= 1 << 20 and asked == int(asked) else 0
        if alignment <= 0 or alignment & (alignment - 1):
            shown = f"{asked:,.0f}" if math.isfinite(asked) and asked == int(asked) else f"{asked:g}"
            raise r.lie(f"general.alignment is {shown}: a power of two up to {1 << 20:,}")
        read = [_tensor_end(r, i, alignment) for i in range(tensors)]
        start = -(-file.tell() // alignment) * alignment
        data = max((end for end, _, _ in read), default=0)
        types = collections.Counter(kind for _, kind, _ in read)
        names = frozenset(name for _, _, name in read)
        if start + data > size:
            raise r.lie(f"its tensors claim {data:,} bytes of data; the file holds {max(size - start, 0):,}")
    check_hyperparameters(numbers, strings, lists, r.lie)
    return GgufHeader(
        version, tensors, metadata, start, data, numbers, strings, lists, dict(types.most_common()), names
    )
