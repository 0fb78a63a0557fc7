"""The comparison's worker: one Comparison, both journeys stepped together.

The thread's shape (queue, guard, autoplay at its pace, frame-paced publishing) is worker.thread's,
as for the journey's worker; this module says what the comparison's commands do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from tokenviz.contract.commands import Command, Pace, Play, Reset, Rewind, Save, Start, Step
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import ComparisonSnapshot
from tokenviz.files.atomic import write_file
from tokenviz.files.documents import comparison_document
from tokenviz.files.journey_file import save_journey
from tokenviz.worker.snapshots import saved_attention_of, snapshot_of
from tokenviz.worker.thread import CommandThread

if TYPE_CHECKING:
    from tokenviz.contract.backend import Progress
    from tokenviz.journey.comparison import Comparison

Build = Callable[["Progress"], "Comparison"]  # loads the models and pairs their sessions


def save_comparison(comparison: Comparison, stem: str) -> list[str]:
    """STEM-a.json and STEM-b.json (each journey, replayable) and STEM.json (the comparison document)."""
    import json

    written = [
        str(save_journey(f"{stem}-{side}.json", snapshot_of(s), saved_attention_of(s), s.analyses.kept()))
        for side, s in zip("ab", comparison.sessions)
    ]
    a, b = (snapshot_of(s) for s in comparison.sessions)
    document = comparison_document(
        a, b, comparison.diffs, comparison.kl_over, comparison.independent_draws, comparison.statistics
    )
    return [*written, str(write_file(f"{stem}.json", json.dumps(document)))]


class CompareWorker(CommandThread[ComparisonSnapshot]):
    thread_name = "tokenviz-compare"

    def __init__(self, build: Build, prompt: str, chat: bool = False, system: str | None = None):
        super().__init__()
        self._build = build
        self._prompt, self._chat, self._system = prompt, chat, system
        self._message = "loading the models"
        self.comparison: Comparison | None = None

    def compare(self, a: SamplingSettings, b: SamplingSettings, prompt: Start) -> CompareWorker:
        raise TokenvizError("this is a comparison already")

    def _load(self) -> None:
        self._publish()
        comparison = self._build(self._progress)
        self._message = "prefilling the prompt in both"
        self._publish()
        comparison.start(self._prompt, chat=self._chat, system=self._system)
        self.comparison = comparison
        self._state, self._message = "ready", ""

    def _progress(self, message: str, fraction: float | None) -> None:  # a Progress
        self._message = message
        self._publish()

    def _ended(self) -> bool:
        return self.comparison is not None and all(s.pending is None for s in self.comparison.sessions)

    def _pauses(self, command: Command) -> bool:
        return not isinstance(command, Play | Pace | Save)

    def _handle(self, command: Command, autoplay: bool) -> None:
        comparison = self.comparison
        assert comparison is not None  # commands are handled once loaded
        match command:
            case Step():
                if not comparison.step():
                    self.playing = False
                    if not autoplay:
                        raise TokenvizError("both journeys have stopped: rewind (backspace) or reset (r)")
            case Rewind(n=n):
                comparison.rewind(n)
            case Reset():
                comparison.reset()
            case Play(on=on):
                self.playing = not self.playing if on is None else on
            case Pace(delta=delta):
                self._step_pace(delta)
            case Save(path=stem):
                self._notice = "saved " + ", ".join(save_comparison(comparison, stem))
            case _:
                raise TokenvizError("a comparison steps, rewinds, resets, plays and saves: nothing else")

    def _snapshot(self, error: str | None) -> ComparisonSnapshot:
        c = self.comparison
        return ComparisonSnapshot(
            seq=self._seq,
            state="playing" if self.playing else self._state,
            message=self._message,
            a=snapshot_of(c.a, seq=self._seq) if c else None,
            b=snapshot_of(c.b, seq=self._seq) if c else None,
            diffs=tuple(c.diffs) if c else (),
            parted_at=c.parted_at if c else None,
            statistics=c.running_figures if c else None,
            kl_over=c.kl_over if c else "",
            independent_draws=c.independent_draws if c else False,
            playing=self.playing,
            pace_s=self.pace_s,
            error=error,
            notice=self._notice,
            handled=self._handled,
        )

    def _fallback(self, error: str) -> ComparisonSnapshot:
        base = self._last_snapshot or ComparisonSnapshot(seq=0, state=self._state)
        return dataclasses.replace(base, seq=self._seq, playing=False, handled=self._handled, error=error)
