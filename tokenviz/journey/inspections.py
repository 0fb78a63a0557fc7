"""Inspections of positions (embedding, residual norms, logit lens), computed once each.

The past of a journey never changes, so an inspection is keyed by the tokens up to its position
and the token that followed; the newest 64 are kept.
"""

from __future__ import annotations

from collections import OrderedDict

from tokenviz.contract.results import Inspection
from tokenviz.model.lens import inspect_positions
from tokenviz.model.runner import ModelRunner

KEEP = 64


class Inspections:
    def __init__(self) -> None:
        self._cache: OrderedDict[tuple[tuple[int, ...], int], Inspection] = OrderedDict()

    def get(self, runner: ModelRunner, ids: list[int], position: int, chosen: int) -> Inspection:
        """The inspection of `position` in `ids`, where `chosen` followed it."""
        key = (tuple(ids[: position + 1]), chosen)
        if key not in self._cache:
            self._cache[key] = inspect_positions(runner, ids[: position + 1], [position], [chosen])[0]
            while len(self._cache) > KEEP:
                self._cache.popitem(last=False)
        return self._cache[key]
