"""A worker that serves one recorded Snapshot: every pane works, nothing runs a model.

Used for replaying a saved journey and for deterministic screenshots in tests. The attention pane
gets the rows the journey file kept.
"""

from __future__ import annotations

import dataclasses

from tokenviz.contract.attention import AttentionView, SavedAttention, window
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.snapshot import Snapshot
from tokenviz.files.journey_file import save_journey
from tokenviz.worker.commands import Command, Post, Save, ShowAttention


class RecordingWorker:
    def __init__(self, snapshot: Snapshot, attention: SavedAttention | None = None):
        self.snapshot = dataclasses.replace(snapshot, live=False)
        self.attention = attention or SavedAttention()
        self.submitted = 0
        self._post: Post | None = None

    def start(self, post: Post) -> None:
        self._post = post
        post(self.snapshot)

    def submit(self, command: Command) -> None:
        self.submitted += 1
        error = notice = None
        attention = self.snapshot.attention
        match command:
            case ShowAttention():
                attention = self._view(command)
            case Save(path=path):
                try:
                    written = save_journey(path, self.snapshot, self.attention)
                    notice = f"saved {written} (tokenviz replay {written})"
                except TokenvizError as exc:
                    error = str(exc)
            case _:
                error = "this journey is a recording: nothing runs a model here"
        self.snapshot = dataclasses.replace(
            self.snapshot,
            seq=self.snapshot.seq + 1,
            handled=self.submitted,
            error=error,
            notice=notice,
            attention=attention,
        )
        if self._post is not None:
            self._post(self.snapshot)

    def _view(self, request: ShowAttention) -> AttentionView | None:
        s = self.snapshot
        positions = s.prompt_len + len(s.records) - 1
        if request.rows <= 0 or s.info is None or positions <= 0:
            return None
        cursor = positions - 1 if request.cursor is None else min(request.cursor, positions - 1)
        layer = min(request.layer, s.info.layers - 1)
        return self.attention.view(layer, window(cursor, positions, request.rows), s.info.heads)

    def cancel(self) -> None:
        pass  # nothing runs

    def stop(self, timeout: float = 0.0) -> bool:
        return True  # nothing runs
