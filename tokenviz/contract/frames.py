"""Frames: a journey's snapshots as a worker sends them, each carrying only what changed in the history.

A Snapshot holds the whole journey (every record, every chip, the decoded text). Sent whole at every
frame, what crosses from the worker grows with the journey: about 3 KB a step. A Frame holds the
snapshot with its growing fields cut to their new tail (the records and chips from the first one
that changed, the text past what the receiver has), and the receiver keeps the history: its
FrameReader puts the whole Snapshot back together. Everything in a Frame is plain contract data: it
pickles, so a worker in another process can send it as it is.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any

from tokenviz.contract.snapshot import Snapshot

TUPLES = ("records", "chips")  # grow by a tail; an item replaced is a new object
TEXTS = ("text", "full_text")  # grow by a tail; a rewind shortens them


@dataclass(frozen=True)
class Frame:
    """A snapshot whose `TUPLES` and `TEXTS` hold only their items from `starts[field]` on."""

    snapshot: Snapshot
    starts: tuple[tuple[str, int], ...]


class FrameWriter:
    """The sender's side: what the receiver holds, and each snapshot as the frame that brings it there."""

    def __init__(self) -> None:
        self._sent: dict[str, Any] = {}

    def frame(self, snapshot: Snapshot) -> Frame:
        cut, starts = {}, []
        for name in TUPLES:
            new, old = getattr(snapshot, name), self._sent.get(name, ())
            start = _same_items(old, new)
            cut[name], self._sent[name] = new[start:], new
            starts.append((name, start))
        for name in TEXTS:
            new, old = getattr(snapshot, name), self._sent.get(name, "")
            start = len(old) if new.startswith(old) else 0
            cut[name], self._sent[name] = new[start:], new
            starts.append((name, start))
        return Frame(dataclasses.replace(snapshot, **cut), tuple(starts))


class FrameReader:
    """The receiver's side: the history so far, and each frame as the whole snapshot it stands for."""

    def __init__(self) -> None:
        self._held: dict[str, Any] = {}

    def read(self, frame: Frame) -> Snapshot:
        whole = {}
        for name, start in frame.starts:
            empty: Any = "" if name in TEXTS else ()
            held = self._held.get(name, empty)
            if start > len(held):
                raise ValueError(f"a frame's {name} starts at {start}, past the {len(held)} held: a frame was lost")
            whole[name] = self._held[name] = held[:start] + getattr(frame.snapshot, name)
        return dataclasses.replace(frame.snapshot, **whole)


def _same_items(old: tuple[Any, ...], new: tuple[Any, ...]) -> int:
    """How many of `new`'s first items are `old`'s very objects (a record changed is a new object)."""
    differ = list(map(operator.is_not, old, new))  # (in C: a 6,000-step journey costs microseconds)
    return differ.index(True) if True in differ else len(differ)
