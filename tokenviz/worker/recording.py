"""A worker that serves one recorded Snapshot: every pane works, nothing runs a model.

Used for replaying a saved journey and for deterministic screenshots in tests.
"""

from __future__ import annotations

import dataclasses

from tokenviz.contract.snapshot import Snapshot
from tokenviz.worker.commands import Command, Post


class RecordingWorker:
    def __init__(self, snapshot: Snapshot):
        self.snapshot = dataclasses.replace(snapshot, live=False)
        self.submitted = 0
        self._post: Post | None = None

    def start(self, post: Post) -> None:
        self._post = post
        post(self.snapshot)

    def submit(self, command: Command) -> None:
        self.submitted += 1
        self.snapshot = dataclasses.replace(
            self.snapshot,
            seq=self.snapshot.seq + 1,
            handled=self.submitted,
            error="this journey is a recording: nothing runs a model here",
        )
        if self._post is not None:
            self._post(self.snapshot)

    def cancel(self) -> None:
        pass  # nothing runs

    def stop(self, timeout: float = 0.0) -> bool:
        return True  # nothing runs
