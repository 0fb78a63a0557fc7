"""Attention as the records hold it: the prefill block plus one row per step, read back as rows and
windows of the causal matrix for one layer and one head (or the mean or max over heads)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from tokenviz.contract.records import StepRecord

HeadMode = Literal["mean", "max"]
Head = int | HeadMode  # one head's index, or a combination of all heads
HEAD_MODES: tuple[HeadMode, ...] = ("mean", "max")


def head_label(head: Head, heads: int, kv_heads: int) -> str:
    if isinstance(head, str):
        return f"head {head} of {heads}"
    group = head // max(heads // kv_heads, 1)
    return f"head {head + 1}/{heads} (kv group {group + 1}/{kv_heads})"


def _reduce(rows: np.ndarray, head: Head) -> np.ndarray:
    """rows: (heads, keys) float16 -> (keys,) float32 for one head, or the mean / max over heads."""
    rows = rows.astype(np.float32)
    reduced: np.ndarray = rows.mean(0) if head == "mean" else rows.max(0) if head == "max" else rows[head]
    return reduced


def attention_row(records: Sequence[StepRecord], prompt_len: int, query: int, layer: int, head: Head) -> np.ndarray:
    """What the token at position `query` attended to: (query + 1,) weights over keys 0..query."""
    if query < prompt_len:
        return _reduce(records[0].attention[layer, :, query, : query + 1], head)
    return _reduce(records[query - prompt_len + 1].attention[layer, :, 0, : query + 1], head)


def attention_window(
    records: Sequence[StepRecord], prompt_len: int, queries: range, keys: range, layer: int, head: Head
) -> np.ndarray:
    """The causal matrix for a window of query rows and key columns; the masked future is NaN."""
    out = np.full((len(queries), len(keys)), np.nan, dtype=np.float32)
    for i, q in enumerate(queries):
        row = attention_row(records, prompt_len, q, layer, head)
        lo, hi = keys.start, min(keys.stop, q + 1)
        if hi > lo:
            out[i, : hi - lo] = row[lo:hi]
    return out


def window(cursor: int, length: int, size: int) -> range:
    """`size` consecutive positions of 0..length-1 that hold `cursor`, as centred as they can be."""
    size = min(size, length)
    start = min(max(cursor - size // 2, 0), length - size)
    return range(start, start + size)
