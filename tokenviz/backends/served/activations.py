"""A served model's internals as the vllm-lens plugin sends them, read without trusting the server.

vllm-lens answers a request that asks (`vllm_xargs`) with an `activations` object: each tensor is
`{"data": base64 of a zstd frame, "dtype", "original_dtype", "shape", "compression": "zstd"}`, each
other value `{"__json__": value}`. Its own client decodes with `cloudpickle.loads` where an entry says
so: a hostile server could run code on the user's machine through it. So nothing of the plugin's is
used here. A tensor is read only when its dtype is a float one, its shape is the one asked for (the
model's layers, positions and widths), its size is bounded before anything is decompressed, the
decompression stops at that size, and every value is finite. Anything else is one EndpointError line.
Steering vectors go the other way in the same form (`tensor_entry`).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from tokenviz.backends.shared.endpoint import EndpointError

MAX_TENSOR_BYTES = 1 << 30  # one tensor of a step: a 405B model's every layer at 2,000 positions is 4 GB
FLOATS: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
BFLOAT16 = ("int16", "torch.bfloat16")  # bfloat16 travels as its bits, viewed as int16
TENSOR_KEYS = {"data", "dtype", "original_dtype", "shape", "compression"}

Shape = Sequence[int | None]  # None: any length there (checked against the others by the caller)


def value_bytes(entry: Any) -> int | None:
    """The bytes of one value of a tensor entry as the plugin sends it (float32 4; float16 and bfloat16 2);
    None where the entry is not a float tensor."""
    if not isinstance(entry, dict):
        return None
    kind = (str(entry.get("dtype")), str(entry.get("original_dtype")))
    if kind == BFLOAT16:
        return 2
    return FLOATS[kind[0]].itemsize if kind[0] in FLOATS else None


def tensor(activations: Any, name: str, shape: Shape, host: str) -> np.ndarray:
    """`activations[name]` as float32 of `shape`, checked as the module says."""
    entry = activations.get(name) if isinstance(activations, dict) else None
    if entry is None:
        raise EndpointError(f"{host} did not send {name} (is the vllm-lens plugin loaded there?)")
    if not isinstance(entry, dict) or not set(entry) <= TENSOR_KEYS or not isinstance(entry.get("data"), str):
        raise EndpointError(f"{host} sent {name} in a form tokenviz does not read (only plain tensors are read)")
    kind = (str(entry.get("dtype")), str(entry.get("original_dtype")))
    itemsize = value_bytes(entry)
    if itemsize is None:
        raise EndpointError(f"{host} sent {name} as {kind[0][:20]!r}, not a float tensor")
    if entry.get("compression") not in ("zstd", None):
        raise EndpointError(f"{host} sent {name} compressed as {str(entry.get('compression'))[:20]!r}")
    sent = entry.get("shape")
    if (
        not isinstance(sent, list)
        or len(sent) != len(shape)
        or not all(type(n) is int and n >= 0 for n in sent)
        or any(want is not None and n != want for n, want in zip(sent, shape))
    ):
        wanted = "×".join("?" if n is None else str(n) for n in shape)
        raise EndpointError(f"{host} sent {name} of shape {str(sent)[:60]}, where the model's is {wanted}")
    size = math.prod(sent) * itemsize
    if size > MAX_TENSOR_BYTES:
        raise EndpointError(f"{host} sent {name} of {size:,} bytes: over the {MAX_TENSOR_BYTES:,} read")
    raw = _payload(entry["data"], entry.get("compression"), size, name, host)
    if kind == BFLOAT16:
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        values = bits.view(np.float32)
    else:
        values = np.frombuffer(raw, dtype=FLOATS[kind[0]]).astype(np.float32)
    if not np.isfinite(values).all():
        raise EndpointError(f"{host} sent {name} with values that are not finite numbers")
    return values.reshape(sent)


def json_value(activations: Any, name: str, host: str) -> Any:
    """A value the plugin sends as `{"__json__": value}` (never anything else: no pickle)."""
    entry = activations.get(name) if isinstance(activations, dict) else None
    if not isinstance(entry, dict) or set(entry) != {"__json__"}:
        raise EndpointError(f"{host} did not send {name} as plain JSON")
    return entry["__json__"]


def _payload(data: str, compression: Any, size: int, name: str, host: str) -> bytes:
    """The tensor's bytes: exactly `size` of them, base64 and zstd undone with bounds."""
    bound = size + size // 64 + 4096  # a zstd frame's worst case over `size` bytes, with room
    if len(data) > 4 * (bound // 3 + 1):
        raise EndpointError(f"{host} sent {name} larger than its shape allows")
    try:
        packed = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EndpointError(f"{host} sent {name} that is not base64") from None
    if compression is None:
        raw = packed
    else:
        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed)) as reader:
                raw = reader.read(size + 1)  # one byte more shows a frame that holds more than it says
        except zstandard.ZstdError:
            raise EndpointError(f"{host} sent {name} that is not a zstd frame") from None
    if len(raw) != size:
        raise EndpointError(f"{host} sent {name} of {len(raw):,} bytes where its shape says {size:,}")
    return raw


def wire_bytes(raw: int) -> int:
    """The most a tensor of `raw` bytes takes in an answer: zstd's worst case, then base64, then its keys."""
    return (raw + raw // 64 + 4096) * 4 // 3 + 1024


def tensor_entry(values: np.ndarray) -> dict[str, Any]:
    """`values` (float32) in the plugin's form, to send (a steering vector)."""
    array = np.ascontiguousarray(values, dtype="<f4")
    data = base64.b64encode(zstandard.ZstdCompressor(level=1).compress(array.tobytes())).decode("ascii")
    return {
        "data": data,
        "dtype": "float32",
        "original_dtype": "torch.float32",
        "shape": list(array.shape),
        "compression": "zstd",
    }


@dataclass(frozen=True)
class QkMeta:
    """How one attention layer turns its queries and keys into weights, as vLLM hands its kernel."""

    scale: float
    soft_cap: float  # 0: none
    window: tuple[int, int]  # (left, right) keys a query sees; -1: unbounded
    alibi: tuple[float, ...] | None  # a slope per head
    sinks: tuple[float, ...] | None  # a sink logit per head


def qk_meta(activations: Any, layers: Sequence[int], heads: int, host: str) -> list[QkMeta]:
    """The plugin's qk_layers and qk_meta for the `layers` asked, checked (finite numbers, one per head)."""
    said, metas = json_value(activations, "qk_layers", host), json_value(activations, "qk_meta", host)
    if said != list(layers) or not isinstance(metas, list) or len(metas) != len(layers):
        raise EndpointError(f"{host} sent the queries and keys of other layers than those asked")
    return [_meta(meta, heads, host) for meta in metas]


# Bounds no model's attention comes near (a scale is 1/sqrt(head dim) or a config's multiplier, a slope
# at most 1, a sink or soft-cap a logit): past them the server's answer is wrong, whatever the weights.
MAX_SCALE = 100.0
MAX_SOFT_CAP = 1e6
MAX_SLOPE = 100.0
MAX_SINK = 1e6


def _meta(meta: Any, heads: int, host: str) -> QkMeta:
    def number(value: Any, low: float, high: float, what: str) -> float:
        if type(value) not in (int, float) or not math.isfinite(value):
            raise ValueError
        if not low <= value <= high:
            raise EndpointError(
                f"{host} sent an attention layer's {what} of {value:.3g}, where a model's lies within "
                f"{low:g} to {high:g}: the server's answer is wrong"
            )
        return float(value)

    def per_head(value: Any, bound: float, what: str) -> tuple[float, ...] | None:
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != heads:
            raise ValueError
        return tuple(number(v, -bound, bound, what) for v in value)

    try:
        if meta.get("use_alibi_sqrt"):
            raise ValueError
        window = meta.get("sliding_window") or [-1, -1]
        if not isinstance(window, list) or len(window) != 2 or not all(type(w) is int and w >= -1 for w in window):
            raise ValueError
        return QkMeta(
            scale=number(meta["scale"], 0.0, MAX_SCALE, "scale"),
            soft_cap=number(meta.get("logits_soft_cap") or 0.0, 0.0, MAX_SOFT_CAP, "soft-cap"),
            window=(window[0], window[1]),
            alibi=per_head(meta.get("alibi_slopes"), MAX_SLOPE, "ALiBi slope"),
            sinks=per_head(meta.get("sinks"), MAX_SINK, "sink"),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise EndpointError(f"{host} sent an attention layer's scale, window or sinks tokenviz cannot read") from None
