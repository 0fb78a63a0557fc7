"""A worker that serves one recorded Snapshot: every pane works, nothing runs a model.

Used for replaying a saved journey and for deterministic screenshots in tests. The step keys move
through the recorded steps (space forward, backspace back, r to the prompt); the attention pane gets
the rows the journey file kept, and the attribution and watch views the analyses it kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tokenviz.contract.attention import AttentionView, SavedAttention
from tokenviz.contract.commands import (
    Attribute,
    Command,
    Request,
    Reset,
    Rewind,
    Save,
    ShowAttention,
    SplitDifference,
    Start,
    Step,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Analyses, ViewResult
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import ComparisonSnapshot, Snapshot
from tokenviz.contract.worker import Post, Worker
from tokenviz.files.journey_file import save_journey
from tokenviz.files.journey_page import save_page

NO_MODEL = "this journey is a recording: nothing runs a model here"


class RecordingWorker:
    def __init__(self, snapshot: Snapshot, attention: SavedAttention | None = None, analyses: Analyses = Analyses()):
        self.recording = dataclasses.replace(snapshot, live=False)
        self.snapshot = self.recording
        self.attention = attention or SavedAttention()
        self.analyses = analyses
        self._request: ShowAttention | None = None
        self.submitted = 0
        self.writes_pending = 0  # a recording writes as it is asked, in submit
        self.write_failures: list[str] = []
        self._post: Post[Snapshot] | None = None

    def start(self, post: Post[Snapshot]) -> None:
        self._post = post
        post(self.snapshot)

    def submit(self, command: Command) -> None:
        self.submitted += 1
        error = notice = None
        attention = self.snapshot.attention
        snapshot = self.snapshot
        results: dict[type[Request[Any]], ViewResult | None] = {
            Attribute: snapshot.result(Attribute),
            SplitDifference: snapshot.result(SplitDifference),
        }
        match command:
            case ShowAttention():
                self._request = command
                attention = self._view(command, snapshot)
            case Step() | Rewind() | Reset():
                snapshot = self._after_move(command)
                attention = self._view(self._request, snapshot) if self._request else None
            case Save(path=path, page_colors=colors, page_view=view):
                try:
                    written = save_journey(path, self.recording, self.attention, self.analyses)
                    page = (
                        save_page(written.with_suffix(".html"), self.recording, self.attention, colors, view)
                        if colors
                        else None
                    )
                    notice = f"saved {written}{f' and {page}' if page else ''} (tokenviz replay {written})"
                except TokenvizError as exc:
                    error = str(exc)
            case Attribute(position=position, method=method):
                kept = [a for a in self.analyses.attributions if (a.position, a.method) == (position, method)]
                results[Attribute] = kept[-1] if kept else None  # the view says the recording has none here
            case SplitDifference(position=position):
                split = [d for d in self.analyses.logit_differences if d.position == position]
                results[SplitDifference] = split[-1] if split else None
            case _:
                error = NO_MODEL
        self.snapshot = dataclasses.replace(
            snapshot,
            seq=self.snapshot.seq + 1,
            handled=self.submitted,
            error=error,
            notice=notice,
            attention=attention,
            results=tuple(value for value in results.values() if value is not None),
        )
        if self._post is not None:
            self._post(self.snapshot)

    def _after_move(self, command: Step | Rewind | Reset) -> Snapshot:
        """The recording up to one step more or fewer than shown now (never past its ends)."""
        full, now = self.recording, self.snapshot
        total = len(full.chips) - full.prompt_len
        shown = len(now.chips) - now.prompt_len
        match command:
            case Step():
                shown = min(shown + 1, total)
            case Rewind(n=n):
                shown = max(shown - n, 0)
            case Reset():
                shown = 0
        if shown == total:
            return dataclasses.replace(full, seq=now.seq)
        chips = full.chips[: full.prompt_len + shown]
        generated = "".join(c.text for c in chips[full.prompt_len :])
        return dataclasses.replace(
            full,
            seq=now.seq,
            chips=chips,
            records=full.records[: shown + 1],
            stop_reason=None,
            text=generated,
            full_text="".join(c.text for c in chips),
            message=f"a recorded journey: step {shown} of {total} (space, backspace and r move through it)",
        )

    def _view(self, request: ShowAttention | None, s: Snapshot) -> AttentionView | None:
        if request is None:
            return None
        positions = s.prompt_len + len(s.records) - 1
        if request.rows <= 0 or s.info is None or positions <= 0:
            return None
        layer, queries = request.resolve(positions, s.info.layers)
        return self.attention.view(layer, queries, s.info.heads)

    def cancel(self) -> None:
        pass  # nothing runs

    def space_frames(self, seconds: float) -> None:
        pass  # nothing plays

    def stop(self, timeout: float = 0.0) -> bool:
        return True  # nothing runs

    def count_tokens(self, text: str) -> int | None:
        return None  # no model

    def compare(self, a: SamplingSettings, b: SamplingSettings, prompt: Start) -> Worker[ComparisonSnapshot]:
        raise TokenvizError(NO_MODEL)
