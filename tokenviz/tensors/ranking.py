"""The largest entries of a vocabulary row, quick on a CPU. torch's topk and argmax over a row are
vectorised poorly there: on the bundled model's 49,152 logits, right after a llama.cpp decode has moved
its weights through the caches, topk took 210 µs and argmax 120 µs a step, numpy's argmax 10 µs. The
ranking here reads the row a few times in numpy: each block of CHUNK's largest, the k-th largest of
those (no top-k entry is below it), then sorts the few entries above it. On another device, or where a
NaN is (torch ranks it first), torch's own operators.

Where numpy ranks, equal values come in ascending id, argmax's rule (torch.topk leaves their order
unspecified)."""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 256  # entries a block: the bundled vocabulary's 192 blocks' maxima bound the top-k


def numpy_reads(tensor: torch.Tensor) -> bool:
    """Whether numpy reads `tensor` where it lies (a CPU's memory), so the ranking and a step's summary run
    in numpy; elsewhere torch's operators keep the work on the device."""
    return tensor.device.type == "cpu"


def top_k(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the `k` largest of the 1-D `row`, largest first, as torch.topk gives them."""
    k = min(k, row.numel())
    if numpy_reads(row) and row.dtype == torch.float32:
        ranked = top_k_in_numpy(row.detach().numpy(), k)
        if ranked is not None:
            return torch.from_numpy(ranked[0]), torch.from_numpy(ranked[1])
    return torch.topk(row, k)


def top_k_in_numpy(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """top_k of the 1-D `x` in numpy: (values, ids); None where torch's own ranking is wanted (a NaN,
    or a row too short for blocks to narrow it)."""
    if k == 0 or x.size < 2 * k * CHUNK:
        return None
    whole = x.size - x.size % CHUNK
    blocks = x[:whole].reshape(-1, CHUNK).max(1)
    if np.isnan(blocks).any() or np.isnan(x[whole:]).any():
        return None
    floor = np.partition(blocks, blocks.size - k)[blocks.size - k]  # the k-th largest block's largest
    ids = np.flatnonzero(x >= floor)
    values = x[ids]
    order = np.lexsort((ids, -values))[:k]
    return values[order], ids[order]


def argmax(row: torch.Tensor) -> torch.Tensor:
    """The id of the largest of the 1-D `row` (the first where several are; a NaN's where one is), a 0-d long
    tensor on the row's device."""
    if not numpy_reads(row) or row.dtype not in (torch.float32, torch.float64):
        return torch.argmax(row)
    return torch.tensor(int(np.argmax(row.detach().numpy())))
