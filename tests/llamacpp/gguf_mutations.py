"""Hostile GGUFs made from the bundled one with one thing changed: a hyperparameter set to 0, negative,
NaN or huge (or added, or of another type), or a tensor retyped with its sizes kept consistent (its
data rewritten at the new type's size, so the header's own checks pass). Written with gguf's reader for
the parts and struct for the rest, so a value gguf's writer would refuse can be written."""

from __future__ import annotations

import functools
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from tokenviz.system.paths import bundled_gguf

UINT32, INT32, FLOAT32, STRING = GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32, GGUFValueType.STRING
NAN, INF = float("nan"), float("inf")


@dataclass(frozen=True)
class Mutation:
    name: str
    key: str | None = None  # the metadata key set (added where the file has none)
    kind: GGUFValueType = UINT32
    value: float | int | str | None = None
    tensor: str | None = None  # or the tensor retyped
    to: GGMLQuantizationType | None = None


def _value(kind: GGUFValueType, value: float | int | str) -> bytes:
    if kind == STRING:
        data = str(value).encode()
        return struct.pack("<IQ", kind, len(data)) + data
    fmt = {UINT32: "I", INT32: "i", FLOAT32: "f", GGUFValueType.UINT64: "Q"}[kind]
    return struct.pack("<I" + fmt, kind, value)


def _key(key: str) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode()


@dataclass(frozen=True)
class _Source:
    """A GGUF taken apart once: its metadata entries as bytes, its tensors, where its data begins."""

    path: Path
    entries: dict[str, bytes]
    tensors: list[tuple[str, list[int], int, int, int]]  # name, shape, type, offset from the data, bytes
    data_start: int


@functools.cache
def _source(path: Path) -> _Source:
    reader = GGUFReader(path)
    entries = {
        name: b"".join(part.tobytes() for part in field.parts)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors = [
        (t.name, [int(n) for n in t.shape], int(t.tensor_type), int(t.data_offset) - reader.data_offset, int(t.n_bytes))
        for t in reader.tensors
    ]
    return _Source(path, entries, tensors, reader.data_offset)


def write_mutation(mutation: Mutation, path: Path, source: Path | None = None) -> Path:
    """The bundled GGUF (or `source`) with `mutation` made, written at `path` (the data copied as it is
    where no tensor is retyped)."""
    parts = _source(source or bundled_gguf())
    entries = dict(parts.entries)
    if mutation.key is not None:
        entries[mutation.key] = _key(mutation.key) + _value(mutation.kind, mutation.value)
    alignment, infos, layout, offset = 32, [], [], 0
    for name, shape, kind, at, size in parts.tensors:
        fresh = None
        if name == mutation.tensor:
            kind = int(mutation.to)
            block, block_bytes = GGML_QUANT_SIZES[mutation.to]
            fresh = int(np.prod(shape)) // block * block_bytes
        infos.append(
            _key(name) + struct.pack(f"<I{len(shape)}Q", len(shape), *shape) + struct.pack("<IQ", kind, offset)
        )
        layout.append((at, size, fresh))
        offset += -(-(size if fresh is None else fresh) // alignment) * alignment
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(entries)) + b"".join(entries.values()) + b"".join(infos)
    with path.open("wb") as out, parts.path.open("rb") as data:
        out.write(head + bytes(-len(head) % alignment))
        if mutation.tensor is None:  # (the same tensors at the same offsets: the data as it is)
            data.seek(parts.data_start)
            shutil.copyfileobj(data, out, 16 << 20)
            return path
        for at, size, fresh in layout:
            if fresh is None:
                data.seek(parts.data_start + at)
                chunk = data.read(size)
            else:
                chunk = bytes(fresh)
            out.write(chunk + bytes(-len(chunk) % alignment))
    return path


def _hyper(key: str, *values: float, kind: GGUFValueType = UINT32) -> list[Mutation]:
    made = []
    for value in values:
        as_kind = FLOAT32 if isinstance(value, float) and kind != FLOAT32 else kind
        as_kind = INT32 if isinstance(value, int) and value < 0 and kind == UINT32 else as_kind
        made.append(Mutation(f"{key}={value}", f"llama.{key}", as_kind, value))
    return made


HUGE = 2**31 - 1
Q = GGMLQuantizationType
MUTATIONS: list[Mutation] = [
    *_hyper("block_count", 0, 513, -1, HUGE, NAN),
    *_hyper("context_length", 0, -1, HUGE, NAN),
    *_hyper("embedding_length", 0, -1, HUGE, 575),
    *_hyper("feed_forward_length", 0, -1, HUGE),
    *_hyper("attention.head_count", 0, -1, HUGE, 7),
    *_hyper("attention.head_count_kv", 0, -1, HUGE, 2),
    *_hyper("vocab_size", 0, -1, HUGE),
    *_hyper("rope.dimension_count", 0, -1, HUGE, 63),
    *_hyper("attention.key_length", 0, HUGE),
    *_hyper("attention.value_length", 0, HUGE),
    *_hyper("rope.freq_base", NAN, INF, 0.0, -1.0, kind=FLOAT32),
    *_hyper("attention.layer_norm_rms_epsilon", NAN, INF, -1.0, kind=FLOAT32),
    *_hyper("expert_used_count", 2),  # (no expert_count)
    *_hyper("expert_count", 100000, 2),  # (2 with no expert_used_count; then used 4 of 2 below)
    Mutation("rope.scaling.type=bogus", "llama.rope.scaling.type", STRING, "bogus"),
    Mutation("general.alignment=NaN", "general.alignment", FLOAT32, NAN),
    Mutation("general.architecture=nonesuch", "general.architecture", STRING, "nonesuch"),
    *(
        Mutation(f"{tensor} as {to.name}", tensor=tensor, to=to)
        for tensor in ("blk.0.ffn_down.weight", "token_embd.weight", "blk.0.attn_norm.weight")
        for to in (Q.Q8_K, Q.I32, Q.F64, Q.I8, Q.I16, Q.I64, Q.Q8_1, Q.F16, Q.Q4_0)
        if int(GGML_QUANT_SIZES[to][0]) in (1, 32) or tensor == "blk.0.ffn_down.weight"
    ),
]
