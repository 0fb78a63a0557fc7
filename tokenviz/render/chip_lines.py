"""Chips laid out in lines of a given width, kept between frames: a journey that grows by one
token re-lays only its last line, so drawing the tokens pane costs what is on screen, not the
journey's length."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence


class ChipLines:
    def __init__(self, cells: Callable[[int], int]):
        self.cells = cells  # a chip's width in cells, by index into the current chips
        self.width = 0
        self.look: object = None
        self._keys: list[object] = []  # what each laid-out chip was: a change re-lays from there
        self._widths: list[int] = []
        self.starts: list[int] = []  # the index of each line's first chip

    def update(self, keys: Sequence[object], width: int, look: object = None) -> None:
        """Lay out `keys` (one per chip) in lines of `width` cells, reusing what did not change;
        a change of `look` (what else sets a chip's width) lays out everything again. Keys kept
        from one journey to the next are compared by identity first (in C), so pass the same
        objects (the snapshot's chips) rather than new ones each frame."""
        keys = list(keys)
        width = max(width, 1)
        same = 0
        if width == self.width and look == self.look:
            old = self._keys
            if len(keys) >= len(old) and keys[: len(old)] == old:  # the usual frame: the journey grew
                same = len(old)
            else:
                limit = min(len(keys), len(old))
                while same < limit and keys[same] == old[same]:
                    same += 1
        else:
            self.width, self.look = width, look
        # Re-lay from the line before the one holding the first changed chip: a changed first chip of
        # a line may now fit at the end of the line before; earlier lines cannot change.
        line = max(bisect_right(self.starts, same) - 2, 0) if self.starts and same else 0
        begin = self.starts[line] if self.starts and same else 0
        del self.starts[line:]
        self._keys = keys
        self._widths = self._widths[:same] + [self.cells(i) for i in range(same, len(keys))]
        used = width  # forces a new line at `begin`
        for i in range(begin, len(keys)):
            w = self._widths[i]
            if used > 0 and used + w > width:  # a chip wider than a line gets a line of its own
                self.starts.append(i)
                used = 0
            used += w

    def line_of(self, index: int) -> int:
        return max(bisect_right(self.starts, index) - 1, 0)

    def line(self, number: int) -> range:
        """The chips of line `number`."""
        stop = self.starts[number + 1] if number + 1 < len(self.starts) else len(self._keys)
        return range(self.starts[number], stop)
