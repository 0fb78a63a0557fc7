"""Results about the journey's past (inspections, attributions), each computed once.

The past of a journey never changes, so a result is keyed by the tokens up to its position, the
token that followed and what was asked; the newest 64 are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

KEEP = 64
T = TypeVar("T")


class PastResults(Generic[T]):
    def __init__(self) -> None:
        self._cache: OrderedDict[Hashable, T] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key not in self._cache:
            self.put(key, compute())
        return self._cache[key]

    def kept(self, key: Hashable) -> T | None:
        """The result kept under `key`, if any (nothing computed)."""
        return self._cache.get(key)

    def put(self, key: Hashable, result: T) -> None:
        """Keep `result` (computed with others, in one pass) as `get` would have."""
        self._cache[key] = result
        while len(self._cache) > KEEP:
            self._cache.popitem(last=False)

    def items(self) -> list[tuple[Hashable, T]]:
        return list(self._cache.items())
