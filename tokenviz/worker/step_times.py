"""How fast the journey goes, and how long a job has left: the rates a frame says, the last step's whole time
and its parts, and a job's time left."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from tokenviz.contract.records import StepRecord
from tokenviz.contract.snapshot import Took

RATE_STEPS = 16  # the last steps a rate is of


def rate(seconds: Iterable[float]) -> float | None:
    """Steps a second over steps that took `seconds` each (None: none, or no time)."""
    times = list(seconds)
    return len(times) / sum(times) if times and sum(times) > 0 else None


def time_left(marks: list[tuple[int, float]], total: int) -> float | None:
    """Seconds a job of `total` units has left, from (units done, when) marks, the first its start: the
    pace since its first unit was done, since the first unit also pays for what the job sets up (a
    beam search's copy of the cache: 5 s, then 1 s a step); the first unit's pace where it is all."""
    done, now = marks[-1]
    if done <= 0:
        return None
    first = next(((n, t) for n, t in marks if n > 0), (0, marks[0][1]))
    since, at = first if done > first[0] else marks[0]
    return (now - at) / (done - since) * (total - done)


class StepTimes:
    """The last steps' whole times and their forward passes' (seconds), so both rates are of the same
    steps; prefills and cache rebuilds are not steps."""

    def __init__(self) -> None:
        self.times: deque[tuple[float, float]] = deque(maxlen=RATE_STEPS)

    def timed(self, step: Callable[[], object], records: Callable[[], Sequence[StepRecord]]) -> None:
        """Run one decode step and count it; `records` gives the journey's records after it."""
        started = time.perf_counter()
        step()
        taken = records()
        forward_s = taken[-1].forward_ms / 1e3 if taken else 0.0
        self.times.append((time.perf_counter() - started, forward_s))

    def clear(self) -> None:
        """Forget the steps counted: the rate said is of steps on screen."""
        self.times.clear()

    def fields(self) -> dict[str, float | int | None]:
        """What a frame says of them: tokens a second, the forward passes' alone, and of how many steps."""
        return dict(
            tokens_per_s=rate(wall for wall, _ in self.times),
            forward_tokens_per_s=rate(forward for _, forward in self.times),
            rate_steps=len(self.times),
        )


class WholeTime:
    """The commands that ran the model, timed whole from their turn to their frame (Snapshot.took): their
    parts counted as they run (the forward passes, the decisions, a model changed), the views' passes and
    the rest added at the end."""

    def __init__(self) -> None:
        self.took: Took | None = None  # the last commands' whole time
        self._from: float | None = None  # when the commands being run began to run the model
        self._parts: dict[str, float] = {}  # their parts so far (ms)

    def begin(self) -> None:
        """A command that runs the model starts (the first of a turn's starts the clock)."""
        if self._from is None:
            self._from = time.perf_counter()

    def count(self, part: str, ms: float) -> None:
        self._parts[part] = self._parts.get(part, 0.0) + ms

    def drop(self) -> None:
        """The commands timed were set aside (an autoplay step that gave way): nothing to say of them."""
        self._from, self._parts = None, {}

    def end(self, views: dict[str, float]) -> None:
        """The commands' frame is next: their whole time, their parts, the views' passes (ms) and the rest."""
        if self._from is None:
            return
        parts = {**self._parts, **views}
        whole = (time.perf_counter() - self._from) * 1e3
        rest = whole - sum(parts.values())
        self.took = Took(whole, tuple(parts.items()) + ((("the rest", rest),) if rest > 0 else ()))
        self.drop()


class JobPace:
    """A long job's pace: the marks time_left reads (its start, its first unit's and its latest)."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, float]] = [(0, time.perf_counter())]

    def left_after(self, done: int, total: int) -> float | None:
        """Seconds left once `done` of `total` units are (None: not known yet)."""
        self.marks.append((done, time.perf_counter()))
        del self.marks[2:-1]
        return time_left(self.marks, total)
