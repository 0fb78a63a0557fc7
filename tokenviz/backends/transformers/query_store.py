"""The query states of recent positions of the current path, kept within a byte budget.

An attention row is the softmax of one position's query against the cached keys, so keeping the
queries (not the rows) lets any layer's row be computed again when a pane asks. The budget bounds
what is kept: the oldest forward passes go first, and a row whose queries are gone is computed by
feeding its tokens again (see ModelRunner.attention), so memory follows what is on screen, not the
journey's length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenviz.backends.transformers.attention import Capture, LayerCall

QUERY_POSITIONS = 1024  # positions whose query states are kept: several screens of attention rows,
QUERY_SHARE = 0.02  # but no more than this share of the device's free memory when the model loads,
QUERY_FLOOR = 32 << 20  # and at least this (about 470 positions of the bundled model)


def query_budget(free: int, per_position: int) -> int:
    """Bytes of query states to keep, given the device's free memory and one position's query states
    (every layer's): the last QUERY_POSITIONS positions where they fit in QUERY_SHARE of it. A row
    further back is fed again when it is shown, so what is kept follows the screen, and memory stays
    near the model's own (the bundled model keeps 71 MB: at 4,096 tokens every position's would be 0.28 GB)."""
    return int(min(QUERY_POSITIONS * per_position, max(free * QUERY_SHARE, QUERY_FLOOR)))


@dataclass
class _Block:
    start: int
    queries: dict[int, torch.Tensor]  # layer -> (heads, positions, head_dim)
    bytes: int


class QueryStore:
    def __init__(self, budget: int = QUERY_FLOOR, position_bytes: int = 1):
        """`position_bytes`: one position's query states, every layer's."""
        self.budget = budget
        self.positions = max(1, budget // max(1, position_bytes))  # the most a block holds (see capturing)
        self.calls: dict[int, LayerCall] = {}  # each layer's attention call, recorded by capturing()
        self._blocks: dict[int, _Block] = {}  # by age: the oldest first
        self._where: dict[int, int] = {}  # position -> the newest block holding it
        self._next = 0
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def add(self, start: int, capture: Capture, fed: int | None = None) -> None:
        """Keep the queries of a forward pass that fed `fed` positions from `start` (the capture may hold
        the last of them only: see capturing's keep_last; None: as many as it holds)."""
        if not capture.queries:
            return
        size = sum(q.numel() * q.element_size() for q in capture.queries.values())
        count = next(iter(capture.queries.values())).shape[1]
        if fed is not None:
            start += fed - count
        block = _Block(start, dict(capture.queries), size)
        key, self._next = self._next, self._next + 1
        self._blocks[key] = block
        self._bytes += size
        for position in range(start, start + count):
            self._where[position] = key
        while self._bytes > self.budget and len(self._blocks) > 1:
            self._evict(next(iter(self._blocks)))

    def _evict(self, key: int) -> None:
        block = self._blocks.pop(key)
        self._bytes -= block.bytes
        count = next(iter(block.queries.values())).shape[1]
        for position in range(block.start, block.start + count):
            if self._where.get(position) == key:
                del self._where[position]

    def drop_from(self, position: int) -> None:
        """Forget positions >= `position` (the cache was cropped: they may be fed differently)."""
        for key in [k for k, b in self._blocks.items() if b.start >= position]:
            self._evict(key)
        for p in [p for p in self._where if p >= position]:
            del self._where[p]

    def clear(self) -> None:
        self._blocks.clear()
        self._where.clear()
        self._bytes = 0

    def missing(self, rows: range) -> list[int]:
        return [p for p in rows if p not in self._where]

    def get(self, layer: int, rows: range) -> torch.Tensor:
        """(heads, len(rows), head_dim): every position must be held (see `missing`)."""
        parts, p = [], rows.start
        while p < rows.stop:
            key = self._where[p]
            block = self._blocks[key]
            end = p + 1
            while end < rows.stop and self._where.get(end) == key:
                end += 1
            parts.append(block.queries[layer][:, p - block.start : end - block.start])
            p = end
        return parts[0] if len(parts) == 1 else torch.cat(parts, 1)
