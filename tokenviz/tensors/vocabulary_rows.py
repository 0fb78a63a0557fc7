"""Work over vocabulary rows where they lie in the CPU's memory, in numpy. Right after a llama.cpp decode
has moved the weights through the caches, each torch operator on the bundled model's 49,152 logits cost
20-40 µs (cache misses in its dispatch), numpy's 10-30; torch's topk took 210 µs a step and its argmax
120 µs, numpy's argmax 10 µs. And numpy sums pairwise: its softmax of those logits is within 5e-8 of
float64's, torch's CPU softmax 5e-6 off. On another device torch's operators keep the work there.

The ranking reads a long row a few times: each block of CHUNK's largest, the k-th largest of those (no
top-k entry is below it), then sorts the few entries above it. Equal values come in ascending id,
argmax's rule (torch.topk leaves their order unspecified); a NaN leaves the ranking to torch, which
ranks it first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tokenviz.tensors import transfer

CHUNK = 256  # entries a block: the bundled vocabulary's 192 blocks' maxima bound the top-k


def softmax(rows: torch.Tensor) -> torch.Tensor:
    """The softmax of `rows` along the last axis (a float32 tensor on a CPU: softmax_in_numpy's)."""
    if transfer.numpy_reads(rows) and rows.dtype == torch.float32:
        return torch.from_numpy(softmax_in_numpy(rows.detach().numpy())[0])
    return torch.softmax(rows, -1)


def softmax_in_numpy(x: np.ndarray, largest: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the softmax of `x` along its last axis, x less each row's largest, each row's sum of exponentials),
    the same numbers whether `x` is one row or several; `largest`: each row's largest where known (a pass
    fewer)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # (a row of NaN or inf: NaN, as torch's)
        shifted = x - (x.max(-1, keepdims=True) if largest is None else largest)
        probs = np.exp(shifted)
        total = probs.sum(-1, keepdims=True)
        probs /= total
    return probs, shifted, total


def top_k_in_numpy(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """top_k of the 1-D `x` in numpy: (values, ids); None where a value is NaN (torch's ranking then)."""
    k = min(k, x.size)
    if k == 0:
        return None
    if x.size < 2 * k * CHUNK:  # a short row: its own k-th largest bounds it
        if np.isnan(x).any():
            return None
        ids = np.flatnonzero(x >= np.partition(x, x.size - k)[x.size - k])
    else:
        whole = x.size - x.size % CHUNK
        maxima = x[:whole].reshape(-1, CHUNK).max(1)
        if np.isnan(maxima).any() or np.isnan(x[whole:]).any():
            return None
        floor = np.partition(maxima, maxima.size - k)[maxima.size - k]  # the k-th largest block's largest
        blocks = np.flatnonzero(maxima >= floor)  # the top-k lie in these blocks (and the tail)
        inside = (blocks[:, None] * CHUNK + np.arange(CHUNK)).reshape(-1)
        ids = np.concatenate([inside[x[inside] >= floor], whole + np.flatnonzero(x[whole:] >= floor)])
    values = x[ids]
    order = np.lexsort((ids, -values))[:k]
    return values[order], ids[order]


@dataclass(frozen=True)
class Reading:
    """What a view reads of one row's softmax (a lens row): its most probable ids and their probabilities,
    and each followed id's probability and rank (1: none more probable)."""

    top_p: tuple[float, ...]
    top_ids: tuple[int, ...]
    followed_p: tuple[float, ...]
    followed_ranks: tuple[int, ...]


def readings(blocks: Sequence[torch.Tensor], top: int, followed: Sequence[int]) -> list[Reading]:
    """Each row of the logits `blocks` ((rows, vocab) each, in order) read after its softmax: `top` entries
    and the ids `followed`. In numpy a row at a time where they lie in the CPU's memory (a lens's rows
    after a llama.cpp decode: torch's operators over them at once cost 3 ms of the lens view's step on a
    128,256-token vocabulary, numpy's a row at a time 2), else by torch's over all the rows at once."""
    if all(transfer.numpy_reads(block) and block.dtype == torch.float32 for block in blocks):
        read = [_reading_in_numpy(row, top, followed) for block in blocks for row in block.detach().numpy()]
        if all(reading is not None for reading in read):
            return read  # type: ignore[return-value]  # (none is None)
    probs = softmax(torch.cat(list(blocks)))
    top_p, top_ids = torch.topk(probs, min(top, probs.shape[-1]), dim=-1)
    chosen = probs[:, list(followed)]
    ranks = (probs[:, None, :] > chosen[:, :, None]).sum(-1) + 1
    return [
        Reading(tuple(p), tuple(i), tuple(c), tuple(r))
        for p, i, c, r in zip(top_p.tolist(), top_ids.tolist(), chosen.tolist(), ranks.tolist())
    ]


def _reading_in_numpy(row: np.ndarray, top: int, followed: Sequence[int]) -> Reading | None:
    """One row's Reading in numpy; None where its ranking is torch's (a NaN)."""
    probs = softmax_in_numpy(row)[0]
    ranked = top_k_in_numpy(probs, top)
    if ranked is None:
        return None
    chosen = probs[list(followed)]
    ranks = tuple(int(np.count_nonzero(probs > p)) + 1 for p in chosen)
    return Reading(tuple(ranked[0].tolist()), tuple(ranked[1].tolist()), tuple(chosen.tolist()), ranks)


def argmax(row: torch.Tensor) -> torch.Tensor:
    """The id of the largest of the 1-D `row` (the first where several are; a NaN's where one is), a 0-d long
    tensor on the row's device."""
    if not transfer.numpy_reads(row) or row.dtype not in (torch.float32, torch.float64):
        return torch.argmax(row)
    return torch.tensor(int(np.argmax(row.detach().numpy())))
