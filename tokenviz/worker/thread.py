"""The shape every worker shares: one long-lived thread owns the model's state.

Commands arrive through a queue and run one at a time, in order, so a storm of keys can never run
two forward passes at once or interleave with a half-done step. After the queue is drained the
thread publishes one frozen snapshot through `post` (Textual's post_message is thread-safe); during
autoplay it publishes at most one frame per `space_frames` (and always the last). Every turn is
guarded: an exception becomes a one-line error in a snapshot, the details go to the log, and the
journey stays usable. Quitting ends the loop at the next command, but a write the user asked for
(Save) that is queued still runs: nothing asked for is lost.

A worker (the journey's, a comparison's) says how to load, how to handle a command, which command
autoplay repeats and how to build its snapshot; the rest is here.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Generic, TypeVar

from tokenviz.contract.commands import Command, Play, Save, Step
from tokenviz.contract.errors import Cancelled, GiveWay, TokenvizError
from tokenviz.contract.settings import PACES_S
from tokenviz.contract.snapshot import ComparisonSnapshot, EngineState, Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.contract.worker import Post
from tokenviz.system.interruptible import interrupt
from tokenviz.worker.errorlog import log_exception

S = TypeVar("S", Snapshot, ComparisonSnapshot)

FRAME_S = 1 / 60  # autoplay publishes at most one frame per FRAME_S (and always the last), unless
# the app asks for fewer: see space_frames


@dataclasses.dataclass(frozen=True)
class _Quit:
    """Ends the loop (sent by stop())."""


class CommandThread(Generic[S]):
    """The thread, the command queue, stop and cancel, the error guard, autoplay at its pace and
    frame-paced publishing. Subclasses give _load, _handle, _snapshot (and may change _autostep,
    _pauses, _pause and _ended)."""

    thread_name = "tokenviz-worker"

    def __init__(self) -> None:
        self._post: Post[S] = lambda snapshot: None
        self._queue: queue.Queue[Command | _Quit] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._writing = threading.Lock()  # guards writes_pending
        self._posting = threading.Lock()  # one frame posted at a time (see _said_meanwhile)
        self._stopping = threading.Event()
        self._cancel_upto = -1  # Escape cancels every command submitted up to this one (see cancel)
        self._running = 0  # the number of the command being run (0: loading); see _cancelled
        self.submitted = 0  # commands sent (UI thread)
        self._handled = 0  # commands done (engine thread)
        self.writes_pending = 0  # Saves submitted and not yet done (either thread; see submit)
        self.write_failures: list[str] = []  # what a write at quitting could not do (the command line prints it)
        self.playing = False
        self.pace_s = PACES_S[0]
        self._state: EngineState = "loading"
        self._message = "starting"
        self._start_error: str | None = None  # shown with the first frame after loading
        self._notice: str | None = None  # one line of news for the next snapshot (a file saved)
        self._seq = 0
        self._last_autostep = 0.0
        self._last_publish = 0.0
        self._first_autostep = True  # no autoplay step since the last command: the next is shown at once
        self._frame_s = FRAME_S
        self._last_snapshot: S | None = None
        self._gave_way = False  # the last autoplay step was set aside for a waiting command (GiveWay)

    # ---- called from the UI thread ----------------------------------------------------------------

    def start(self, post: Post[S]) -> None:
        self._post = post
        self._thread.start()

    def submit(self, command: Command) -> None:
        self.submitted += 1
        if isinstance(command, Save):
            with self._writing:
                self.writes_pending += 1
        self._queue.put(command)

    def space_frames(self, seconds: float) -> None:
        """During autoplay publish at most one frame per `seconds`: the app draws no more often, and
        a snapshot nobody draws still costs the model its time (the attention rows, mostly)."""
        self._frame_s = max(seconds, FRAME_S)

    def cancel(self) -> None:
        """Cancel the long run going on at its next chunk, and any queued behind it (the journey stays
        as it was): every command submitted so far. One pressed just before its job starts still counts.
        Work that may stop part way stops now (see system.interruptible): a compile while the model loads
        (the load goes on without it), a chat template rendering (the prompt is not started)."""
        if interrupt(self._thread):
            return
        self._cancel_upto = self.submitted

    def _cancels_from_now(self) -> None:
        """Escape pressed before now cancels nothing that starts from here (a load's prefill: Escape during
        the weights' load was told that it cannot stop them)."""
        self._cancel_upto = -1

    def stop(self, timeout: float = 1.0) -> bool:
        """Ask the thread to end (a long run stops at its next forward pass); True once it has."""
        self._stopping.set()
        self._queue.put(_Quit())
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def count_tokens(self, text: str) -> int | None:
        return None  # a worker with a tokenizer says

    # ---- what a worker gives ------------------------------------------------------------------------

    def _load(self) -> None:
        """Load the model and start the journey (in the thread; raise TokenvizError to refuse)."""
        raise NotImplementedError

    def _handle(self, command: Command, autoplay: bool) -> None:
        """Run one command (raise TokenvizError for the user's mistake)."""
        raise NotImplementedError

    def _snapshot(self, error: str | None) -> S:
        """Everything the panes show now."""
        raise NotImplementedError

    def _fallback(self, error: str) -> S:
        """The snapshot shown when building one failed: the last good one with the error."""
        raise NotImplementedError

    def _autostep(self) -> Command:
        """The command autoplay repeats."""
        return Step()

    def _after_autostep(self) -> None:
        """After each autoplay step (a continuation ends here)."""

    def _pauses(self, command: Command) -> bool:
        """Whether `command`, sent by a key, pauses autoplay first (settings and views do not)."""
        return not isinstance(command, Play | Save)

    def _pause(self) -> None:
        self.playing = False

    def _ended(self) -> bool:
        """Whether the journey has stopped (autoplay stops with it)."""
        return False

    def _settle(self) -> str | None:
        """After the queued commands, before their frame: the work they left for the views, done once for
        them all (ten rewinds, one attention pass); a one-line error or None."""
        return None

    def _background(self) -> bool:
        """A slice of work no key waits for, done while the engine is idle (a prefill's deferred
        predictions); False when there is none."""
        return False

    # ---- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._finish_writes()

    def _serve(self) -> None:
        try:
            self._load()
        except TokenvizError as exc:
            self._state, self._message = "error", safe_text(str(exc))
            self._publish(error=self._message)
            return
        except Exception as exc:  # not foreseeable: one line, and the traceback in the log
            self._state = "error"
            self._message = safe_text(f"internal error while loading: {exc} ({log_exception()})")
            self._publish(error=self._message)
            return
        self._publish(error=self._start_error)
        while not self._stopping.is_set():
            try:
                if not self._turn():
                    return
            except Exception as exc:  # a bug outside any one command (publishing, say): show it, go on
                self.playing = False
                self._publish(error=safe_text(f"internal error: {exc} ({log_exception()})"))

    def _turn(self) -> bool:
        """One turn: an autoplay step, or every queued command; then publish. False: quit."""
        if self.playing and self._queue.empty():
            wait = self._last_autostep + self.pace_s - time.perf_counter()
            if wait <= 0:
                self._last_autostep = time.perf_counter()
                error = self._do(self._autostep(), autoplay=True)
                if self._gave_way:  # the waiting command runs in the next turn, the step after it
                    self._gave_way = False
                    return True
                self._after_autostep()
                if not self.playing:  # autoplay ended here: the views as a frame at rest has them
                    error = error or self._settle()
                first, self._first_autostep = self._first_autostep, False  # it answers the key
                due = self.pace_s or first or time.perf_counter() - self._last_publish >= self._frame_s
                if error or not self.playing or due:
                    self._publish(error=error)
                return True
            try:  # a slow pace: wait for the next step, or a command
                command = self._queue.get(timeout=wait)
            except queue.Empty:
                return True
        elif self._queue.empty() and self._background():  # idle: a slice of background work, then keys again
            self._publish()
            return True
        else:
            command = self._queue.get()
        if isinstance(command, _Quit):
            return False
        self._first_autostep = True
        error = self._do(command)
        while error is None and not self._queue.empty() and not self._stopping.is_set():
            command = self._queue.get()
            if isinstance(command, _Quit):
                return False
            error = self._do(command)
        settled = self._settle()
        self._publish(error=error or settled)
        return True

    def _finish_writes(self) -> None:
        """At quitting: the Saves still queued run (each a journey the user asked to keep); the rest go."""
        while True:
            try:
                command = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Save):
                error = self._do(command)
                if error is not None:
                    self.write_failures.append(error)

    def _do(self, command: Command, autoplay: bool = False) -> str | None:
        """Run one command; returns a one-line error or None."""
        self._running = self._handled + 1  # commands are numbered as submitted; autoplay's share the next one's
        try:
            if not autoplay and self._pauses(command):
                self._pause()
            self._handle(command, autoplay)
        except GiveWay:  # only an autoplay step gives way, and it left the journey as it was
            self._gave_way = True
        except Cancelled as exc:  # the user's choice, not a mistake: news, and the view says so
            self.playing = False
            self._notice = safe_text(str(exc))
        except TokenvizError as exc:  # an engine's own words, a plugin's among them: made safe to print here
            if autoplay:
                self.playing = False
            return safe_text(str(exc))
        except Exception as exc:  # a bug, not the user's mistake: keep the app alive, log the details
            self.playing = False
            return safe_text(f"internal error: {exc} ({log_exception()})")
        finally:
            if not autoplay:
                self._handled += 1
            if isinstance(command, Save):
                with self._writing:
                    self.writes_pending -= 1
        if self._ended():
            self.playing = False
        return None

    def _step_pace(self, delta: int) -> None:
        """Autoplay slower (+1) or faster (-1), through PACES_S (kept at its ends)."""
        index = PACES_S.index(self.pace_s) + delta
        self.pace_s = PACES_S[min(max(index, 0), len(PACES_S) - 1)]

    def _command_waiting(self) -> bool:
        """Asked between the layers of an autoplay step: a key is waiting, so the step gives way."""
        return not self._queue.empty()

    def _cancelled(self) -> bool:
        """Asked between the forward passes of a long run: Escape, or quitting, ends it there."""
        return self._cancel_upto >= self._running or self._stopping.is_set()

    def _publish(self, error: str | None = None) -> None:
        with self._posting:
            self._seq += 1
            self._last_publish = time.perf_counter()
            try:
                snapshot = self._snapshot(error)
                self._notice = None  # said in this frame; a frame that failed to build leaves it for the next
            except TokenvizError as exc:  # foreseeable (a server that stopped answering): the journey is intact
                self.playing = False
                snapshot = self._fallback(safe_text(str(exc)))
            except Exception as exc:  # the journey is intact: show the last good frame with the error
                self.playing = False
                snapshot = self._fallback(safe_text(f"internal error while drawing: {exc} ({log_exception()})"))
            self._last_snapshot = snapshot
            self._post(snapshot)

    def _said_meanwhile(self, line: str, view: str = "") -> None:
        """`line` in the status line, said from another thread while this one waits (a server's request
        past a second, a view's pass): the last frame again with it as its message (and `view` as the view
        being computed), the same journey and number (so no view asks again); the engine thread's next
        frame replaces it."""
        with self._posting:
            last = self._last_snapshot
            if last is not None and not self._stopping.is_set():
                self._post(dataclasses.replace(last, message=line, computing=view))
