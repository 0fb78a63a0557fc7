"""Attention as the panes receive it: exact weights of one layer for the query rows a pane shows
(computed by the engine when asked), and the rows a saved journey carries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

HeadMode = Literal["mean", "max"]
Head = int | HeadMode  # one head's index, or a combination of all heads
HEAD_MODES: tuple[HeadMode, ...] = ("mean", "max")


def head_label(head: Head, heads: int, kv_heads: int) -> str:
    """A head as every view names it: counted from 0, as layers and positions are (and as --ablate
    L.H takes it), out of how many there are."""
    if isinstance(head, str):
        return f"head {head} of {heads}"
    if kv_heads in (1, heads):  # no groups to tell apart (multi-query, or latent attention: one latent)
        return f"head {head} of {heads}"
    group = head // max(heads // kv_heads, 1)
    return f"head {head} of {heads} (kv group {group} of {kv_heads})"


def window(cursor: int, length: int, size: int, paged: bool = True) -> range:
    """Up to `size` consecutive positions of 0..length-1 that hold `cursor`. Following the newest
    position (the last) while `paged` (autoplay), it moves in steps of half its size: while a journey
    grows, the rows on screen stay where they are (a step draws only the newest), and when the newest
    reaches the end it jumps to the middle. Anywhere else, and at rest, it is as full as it can be (at
    rest, a half-empty map under the newest row was room wasted: UX 7's finding 20)."""
    start = 0 if length <= size else paged_start(cursor, size)
    if cursor < length - 1 or not paged:
        start = max(min(start, length - size), 0)
    return range(start, min(start + size, length))


def paged_start(cursor: int, size: int) -> int:
    """Where a window of `size` moving by half-windows starts to hold `cursor` in its second half."""
    half = max(size // 2, 1)
    return max(cursor // half - 1, 0) * half


@dataclass(frozen=True)
class AttentionView:
    """One layer's attention for consecutive query rows: row i is what position queries.start + i
    attended to, over keys 0..queries.stop - 1 (the masked future and rows not known are NaN)."""

    layer: int
    queries: range
    weights: np.ndarray = field(repr=False, compare=False)  # float32 (heads, len(queries), queries.stop)
    missing: str = ""  # why some rows are NaN (a journey file that did not keep them), else ""
    failed: bool = False  # every row is NaN: the engine could not give them (`missing` says why)

    def covers(self, layer: int, queries: range) -> bool:
        return layer == self.layer and self.queries.start <= queries.start and queries.stop <= self.queries.stop

    def row(self, query: int, head: Head) -> np.ndarray:
        """What the token at `query` attended to: (query + 1,) weights over keys 0..query."""
        return _reduce(self.weights[:, query - self.queries.start, : query + 1], head)

    def window(self, queries: range, keys: range, head: Head) -> np.ndarray:
        """The causal matrix for some of the rows and a window of key columns; the future is NaN."""
        rows = self.weights[:, queries.start - self.queries.start : queries.stop - self.queries.start]
        out = np.full((len(queries), len(keys)), np.nan, dtype=np.float32)
        stop = min(keys.stop, rows.shape[-1])
        if stop > keys.start:
            out[:, : stop - keys.start] = _reduce(rows[:, :, keys.start : stop], head)
        return out


def _reduce(rows: np.ndarray, head: Head) -> np.ndarray:
    """rows: (heads, ...) -> (...) for one head, or the mean / max over heads."""
    rows = rows.astype(np.float32, copy=False)
    reduced: np.ndarray = rows.mean(0) if head == "mean" else rows.max(0) if head == "max" else rows[head]
    return reduced


def causal_view(layer: int, queries: range, weights: np.ndarray, missing: str = "") -> AttentionView:
    """A view of `weights` (heads, len(queries), >= queries.stop) with the future set to NaN."""
    weights = np.array(weights[..., : queries.stop], dtype=np.float32)
    future = np.arange(queries.stop)[None, :] > np.arange(queries.start, queries.stop)[:, None]
    weights[:, future] = np.nan
    return AttentionView(layer=layer, queries=queries, weights=weights, missing=missing)


@dataclass(frozen=True)
class SavedAttention:
    """The attention rows a journey file keeps: every layer's row at the newest positions, as many
    as its budget allowed (older rows were not saved)."""

    rows: Mapping[int, np.ndarray] = field(default_factory=dict)  # position -> float16 (layers, heads, >= position + 1)

    def view(self, layer: int, queries: range, heads: int) -> AttentionView:
        weights = np.full((heads, len(queries), queries.stop), np.nan, dtype=np.float32)
        for i, q in enumerate(queries):
            row = self.rows.get(q)
            if row is not None:
                weights[:, i, : q + 1] = row[layer, :, : q + 1]
        unsaved = [q for q in queries if q not in self.rows]
        missing = f"rows {unsaved[0]}-{unsaved[-1]} were not saved in this journey file" if unsaved else ""
        return causal_view(layer, queries, weights, missing)
