"""The attention rows the pane shows, kept between snapshots.

A row is the attention of one query position over the keys before it, so it stays true while the
tokens up to that position stay the same. During autoplay the window moves on by one position per
step: only the new row is computed, not the whole window again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tokenviz.contract.attention import AttentionView
from tokenviz.contract.engine import IsCancelled

if TYPE_CHECKING:
    from tokenviz.journey.session import Session


class AttentionRows:
    def __init__(self) -> None:
        self._layer = -1
        self._ids: list[int] = []  # the tokens the rows were computed on
        self._rows: dict[int, np.ndarray] = {}  # position -> (heads, position + 1)

    def view(self, session: Session, layer: int, queries: range, cancelled: IsCancelled = None) -> AttentionView:
        ids = session.cached_ids
        same = min(len(ids), len(self._ids))
        if layer != self._layer or ids[:same] != self._ids[:same]:
            same = 0
        self._layer, self._ids = layer, list(ids)
        self._rows = {q: row for q, row in self._rows.items() if q in queries and q < same}
        missing = [q for q in queries if q not in self._rows]
        if missing:
            fresh = range(missing[0], missing[-1] + 1)
            weights = session.attention(fresh, [layer], cancelled)[0]
            for i, q in enumerate(fresh):
                self._rows[q] = weights[:, i, : q + 1]
        heads = next(iter(self._rows.values())).shape[0]
        weights = np.full((heads, len(queries), queries.stop), np.nan, dtype=np.float32)  # NaN: the future
        for i, q in enumerate(queries):
            weights[:, i, : q + 1] = self._rows[q]
        return AttentionView(layer=layer, queries=queries, weights=weights)
