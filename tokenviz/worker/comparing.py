"""The engine thread of `tokenviz compare`: one Comparison, both journeys stepped together.

Like the app's engine (worker/engine), one long-lived thread owns both models' caches; commands
arrive through a queue, each turn is guarded, and a ComparisonSnapshot goes out after each.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.snapshot import ComparisonSnapshot, EngineState
from tokenviz.files.atomic import write_file
from tokenviz.files.journey_file import save_journey
from tokenviz.files.trace_document import document_of_snapshot
from tokenviz.worker.commands import Play, Reset, Rewind, Save, Step
from tokenviz.worker.errorlog import log_exception
from tokenviz.worker.snapshots import snapshot_of

if TYPE_CHECKING:
    from tokenviz.journey.comparison import Comparison
    from tokenviz.worker.loader import Progress

CompareCommand = Step | Rewind | Reset | Play | Save
Build = Callable[["Progress"], "Comparison"]  # loads the models and pairs their sessions


def comparison_document(comparison: Comparison) -> dict[str, Any]:
    """Both journeys as trace documents, with their differences over the steps both have taken."""
    a, b = (document_of_snapshot(snapshot_of(session)) for session in comparison.sessions)
    both = min(len(a["steps"]), len(b["steps"]))
    parted = comparison.parted_at
    return {
        "a": a,
        "b": b,
        "diff": [d.to_json() for d in comparison.diffs[:both]],
        "parted_at": parted if parted is not None and parted < both else None,
    }


def save_comparison(comparison: Comparison, stem: str) -> list[str]:
    """STEM-a.json and STEM-b.json (each journey, replayable) and STEM.json (the comparison document)."""
    written = [
        str(save_journey(f"{stem}-{side}.json", snapshot_of(s), s.saved_attention(), s.kept_analyses()))
        for side, s in zip("ab", comparison.sessions)
    ]
    return [*written, str(write_file(f"{stem}.json", json.dumps(comparison_document(comparison))))]


@dataclasses.dataclass(frozen=True)
class _Quit:
    """Ends the loop (sent by stop())."""


class CompareWorker:
    def __init__(self, build: Build, prompt: str, chat: bool = False, system: str | None = None):
        self._build = build
        self._prompt, self._chat, self._system = prompt, chat, system
        self._post: Callable[[ComparisonSnapshot], object] = lambda snapshot: None
        self._queue: queue.Queue[CompareCommand | _Quit] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tokenviz-compare", daemon=True)
        self._stopping = threading.Event()
        self.comparison: Comparison | None = None
        self.playing = False
        self.submitted = 0
        self._handled = 0
        self._seq = 0
        self._state: EngineState = "loading"
        self._message = "loading the models"
        self._notice: str | None = None

    def start(self, post: Callable[[ComparisonSnapshot], object]) -> None:
        self._post = post
        self._thread.start()

    def submit(self, command: CompareCommand) -> None:
        self.submitted += 1
        self._queue.put(command)

    def stop(self, timeout: float = 1.0) -> bool:
        self._stopping.set()
        self._queue.put(_Quit())
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._publish()
            comparison = self._build(self._progress)
            self._message = "prefilling the prompt in both"
            self._publish()
            comparison.start(self._prompt, chat=self._chat, system=self._system)
            self.comparison = comparison
        except TokenvizError as exc:
            self._state, self._message = "error", str(exc)
            self._publish(error=str(exc))
            return
        except Exception as exc:  # not foreseeable: one line, and the traceback in the log
            self._state, self._message = "error", f"internal error while loading: {exc} ({log_exception()})"
            self._publish(error=self._message)
            return
        self._state, self._message = "ready", ""
        self._publish()
        while not self._stopping.is_set():
            if self.playing and self._queue.empty():
                command: CompareCommand | _Quit = Step()
                autoplay = True
            else:
                command, autoplay = self._queue.get(), False
            if isinstance(command, _Quit):
                return
            self._publish(error=self._do(comparison, command, autoplay))

    def _progress(self, message: str, fraction: float | None) -> None:  # (a Progress)
        self._message = message
        self._publish()

    def _do(self, comparison: Comparison, command: CompareCommand, autoplay: bool) -> str | None:
        """Run one command; returns a one-line error or None."""
        try:
            if not autoplay and not isinstance(command, Play | Save):
                self.playing = False
            self._handle(comparison, command, autoplay)
        except TokenvizError as exc:
            self.playing = False
            return str(exc)
        except Exception as exc:  # a bug: keep the app alive, log the details
            self.playing = False
            return f"internal error: {exc} ({log_exception()})"
        finally:
            if not autoplay:
                self._handled += 1
        if all(session.pending is None for session in comparison.sessions):
            self.playing = False
        return None

    def _handle(self, comparison: Comparison, command: CompareCommand, autoplay: bool) -> None:
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
            case Save(path=stem):
                self._notice = "saved " + ", ".join(save_comparison(comparison, stem))

    def _publish(self, error: str | None = None) -> None:
        self._seq += 1
        c = self.comparison
        state: EngineState = "playing" if self.playing else self._state
        self._post(
            ComparisonSnapshot(
                seq=self._seq,
                state=state,
                message=self._message,
                a=snapshot_of(c.a, seq=self._seq) if c else None,
                b=snapshot_of(c.b, seq=self._seq) if c else None,
                diffs=tuple(c.diffs) if c else (),
                parted_at=c.parted_at if c else None,
                playing=self.playing,
                error=error,
                notice=self._take_notice(),
                handled=self._handled,
            )
        )

    def _take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice
