"""Reading a step's results off the device without stalling it.

On a GPU every read of a value (`.item()`, `.tolist()`, `float(t)`, `.cpu()`) waits for the device
to finish. A step therefore computes everything it needs on the device, packs the tensors' bytes
into one buffer there and copies that buffer once; timings come from device events, so timing a
forward pass adds no wait of its own. Copies the other way (token ids) are queued, not waited for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch

_ALIGN = 8  # every part starts on an 8-byte boundary, so float64 and int64 views stay aligned


def to_host(parts: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Copy several device tensors to the CPU in one transfer, as numpy arrays of the same shapes (tensors
    already in the CPU's memory: each copied by numpy, which waits for nothing and calls no operator).

    bfloat16 has no numpy type: convert such tensors before packing them.
    """
    if not parts:
        return {}
    if all(numpy_reads(tensor) for tensor in parts.values()):  # nothing to wait for: each
        return {name: np.array(_detached(tensor).numpy()) for name, tensor in parts.items()}  # copied in numpy
    device = next(iter(parts.values())).device  # a model spread over GPUs: gathered here first, device to device
    chunks, layout, offset = [], [], 0
    for name, tensor in parts.items():  # each call below only where it does something: a step's operator calls
        tensor = _detached(tensor)
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)
        if raw.device != device:
            raw = raw.to(device, non_blocking=True)
        padding = -raw.numel() % _ALIGN
        chunks.append(raw)
        if padding:
            chunks.append(torch.zeros(padding, dtype=torch.uint8, device=device))
        layout.append((name, offset, tensor.dtype, tuple(tensor.shape)))
        offset += raw.numel() + padding
    buffer = torch.cat(chunks).cpu().numpy()
    out: dict[str, np.ndarray] = {}
    for name, start, dtype, shape in layout:
        count = math.prod(shape)
        out[name] = np.frombuffer(buffer, dtype=_NUMPY_DTYPES[dtype], count=count, offset=start).reshape(shape)
    return out


def numpy_reads(tensor: torch.Tensor) -> bool:
    """Whether numpy reads `tensor` where it lies (a CPU's memory): nothing to wait for, no operator to call
    (a step's summary and ranking then run in numpy: see tensors.vocabulary_rows)."""
    return tensor.device.type == "cpu"


def _detached(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach() if tensor.requires_grad else tensor


_NUMPY_DTYPES = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, the copy queued, not waited for: a copy to a GPU from ordinary
    (pageable) host memory first waits for the work already queued, such as the forward pass, so the
    tensor goes through pinned memory (PyTorch keeps that block until the copy is done)."""
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def at(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values[index] for a one-number device tensor `index`, without reading it: plain indexing
    reads the number to the host, which on a GPU waits for all the work queued before it."""
    return values.index_select(0, index.reshape(1)).reshape(())


def ids_to_device(ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """Token ids as a (1, n) long tensor on `device` (see to_device)."""
    return to_device(torch.tensor([list(ids)], dtype=torch.long), device)


class DeviceTimer:
    """Wall time of work queued on a device. CUDA work is timed with events, which the step's
    transfer completes, so `ms()` never waits. On the CPU the work has finished when `stop()` runs;
    other devices (MPS) are synchronised there, so their figures stay true."""

    def __init__(self, device: torch.device):
        self._device = device
        self._events = None
        if device.type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._started = time.perf_counter()
        self._ms: float | None = None

    def stop(self) -> DeviceTimer:
        if self._events is not None:
            self._events[1].record()
        else:
            if self._device.type == "mps":
                torch.mps.synchronize()
            self._ms = (time.perf_counter() - self._started) * 1000
        return self

    def wait(self) -> DeviceTimer:
        """Wait until the timed work is done (a long prefill reports progress chunk by chunk)."""
        if self._events is not None:
            self._events[1].synchronize()
        return self

    def ms(self) -> float:
        """Read after the step's transfer (or any other wait on the device)."""
        if self._events is not None:
            return float(self._events[0].elapsed_time(self._events[1]))
        assert self._ms is not None, "stop() first"
        return self._ms
