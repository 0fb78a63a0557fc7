"""The engine thread of `tokenviz compare`: one Comparison, both journeys stepped together.

Like the app's engine (worker/engine), one long-lived thread owns both models' caches; commands
arrive through a queue, each turn is guarded, and a ComparisonSnapshot goes out after each.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.snapshot import ComparisonSnapshot, EngineState
from tokenviz.worker.commands import Play, Reset, Rewind, Step
from tokenviz.worker.errorlog import log_exception
from tokenviz.worker.snapshots import snapshot_of

if TYPE_CHECKING:
    from tokenviz.journey.comparison import Comparison
    from tokenviz.worker.loader import Progress

CompareCommand = Step | Rewind | Reset | Play
Build = Callable[["Progress"], "Comparison"]  # loads the models and pairs their sessions


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
        try:
            if not autoplay and not isinstance(command, Play):
                self.playing = False
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
                handled=self._handled,
            )
        )
