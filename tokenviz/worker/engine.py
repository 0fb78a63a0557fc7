"""The engine thread: one long-lived thread owns the model, its cache and the session.

Commands arrive through a queue and run one at a time, in order, so a storm of keys can never
run two forward passes at once or interleave with a half-done step. After the queue is drained the
thread publishes one frozen Snapshot through `post` (Textual's post_message is thread-safe).
Every turn of the loop is guarded: an exception becomes a one-line error in a Snapshot, the
details go to the log, and the journey stays usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, assert_never

from tokenviz.contract.attention import AttentionView
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import DEFAULT_SETTINGS, PACES_S, SamplingSettings
from tokenviz.contract.snapshot import EngineState, Snapshot
from tokenviz.decoding.nudges import adjust
from tokenviz.files.journey_file import save_journey
from tokenviz.files.journey_page import save_page
from tokenviz.worker.attention_rows import AttentionRows
from tokenviz.worker.commands import (
    Adjust,
    Attribute,
    Beams,
    BranchAt,
    Command,
    Continue,
    Force,
    Inspect,
    Move,
    Pace,
    Play,
    Post,
    Reset,
    Rewind,
    Save,
    ShowAttention,
    Speculate,
    SplitDifference,
    Start,
    Step,
    SwitchBranch,
    Verify,
    Watch,
)
from tokenviz.worker.errorlog import log_exception
from tokenviz.worker.loader import Loader
from tokenviz.worker.snapshots import snapshot_of

if TYPE_CHECKING:
    from tokenviz.contract.results import (
        Attribution,
        AttributionMethod,
        BeamResult,
        Inspection,
        LogitDifference,
        Speculation,
        Verification,
    )
    from tokenviz.journey.session import Session

FRAME_S = 1 / 60  # autoplay publishes at most one frame per FRAME_S (and always the last), unless
# the app asks for fewer: see space_frames
ALLOWED_WITHOUT_JOURNEY = (Start, Adjust, ShowAttention)
BUSY: dict[type, EngineState] = {  # what the status line says while a command runs
    Step: "stepping",
    Force: "stepping",
    BranchAt: "stepping",
    SwitchBranch: "stepping",
    Rewind: "stepping",
    Continue: "stepping",
    Verify: "verifying",
    Beams: "searching beams",
    Speculate: "speculating",
    Attribute: "attributing",
    Watch: "watching",
    SplitDifference: "watching",
}


@dataclasses.dataclass(frozen=True)
class _Quit:
    """Ends the loop (sent by stop())."""


class EngineWorker:
    def __init__(
        self, loader: Loader, settings: SamplingSettings, prompt: str, chat: bool = False, system: str | None = None
    ):
        self._loader = loader
        self._prompt = Start(prompt, chat, system)
        self._settings = settings
        self._post: Post = lambda snapshot: None
        self._queue: queue.Queue[Command | _Quit] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tokenviz-engine", daemon=True)
        self._stopping = threading.Event()
        self._cancel = threading.Event()
        self._busy: EngineState | None = None  # shown instead of the journey's state while set
        self.submitted = 0  # commands sent (UI thread)
        self._handled = 0  # commands done (engine thread)
        self.session: Session | None = None
        self.playing = False
        self.pace_s = PACES_S[0]
        self._last_autostep = 0.0
        self._seq = 0
        self._state: EngineState = "loading"
        self._message = "starting"
        self._progress: float | None = None
        self._step_times: deque[float] = deque(maxlen=16)
        self._warm_temperature = settings.temperature or DEFAULT_SETTINGS.temperature  # what greedy-off returns to
        self._start_error: str | None = None
        self._last_publish = 0.0
        self._frame_s = FRAME_S
        self._last_snapshot: Snapshot | None = None
        self._inspection: Inspection | None = None
        self._attribution: Attribution | None = None
        self._difference: LogitDifference | None = None
        self._verification: Verification | None = None
        self._beams: BeamResult | None = None
        self._speculation: Speculation | None = None
        self._attention_request: ShowAttention | None = None
        self._attention_rows = AttentionRows()
        self._notice: str | None = None
        self._forced: deque[int] = deque()  # a continuation's tokens still to force (see Continue)
        self._forced_total = 0

    # ---- called from the UI thread ----------------------------------------------------------------

    def start(self, post: Post) -> None:
        self._post = post
        self._thread.start()

    def submit(self, command: Command) -> None:
        self.submitted += 1
        self._queue.put(command)

    def space_frames(self, seconds: float) -> None:
        """During autoplay publish at most one frame per `seconds`: the app draws no more often, and
        a snapshot nobody draws still costs the model its time (the attention rows, mostly)."""
        self._frame_s = max(seconds, FRAME_S)

    def cancel(self) -> None:
        """Cancel a long prefill at its next chunk (the journey stays as it was)."""
        self._cancel.set()

    def stop(self, timeout: float = 1.0) -> bool:
        """Ask the thread to end (a long run stops at its next forward pass); True once it has."""
        self._stopping.set()
        self._queue.put(_Quit())
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except TokenvizError as exc:
            self._state, self._message = "error", str(exc)
            self._publish(error=str(exc))
            return
        except Exception as exc:  # not foreseeable: one line, and the traceback in the log
            self._state = "error"
            self._message = f"internal error while loading: {exc} ({log_exception()})"
            self._publish(error=self._message)
            return
        self._publish(error=self._start_error)
        while not self._stopping.is_set():
            try:
                if not self._turn():
                    return
            except Exception as exc:  # a bug outside any one command (publishing, say): show it, go on
                self.playing = False
                self._publish(error=f"internal error: {exc} ({log_exception()})")

    def _turn(self) -> bool:
        """One turn: an autoplay step, or every queued command; then publish. False: quit."""
        if self.playing and self._queue.empty():
            wait = self._last_autostep + self.pace_s - time.perf_counter()
            if wait <= 0:
                self._last_autostep = time.perf_counter()
                error = self._do(Step(self._forced.popleft() if self._forced else None), autoplay=True)
                if self._forced_total and (not self._forced or not self.playing):  # through, or stopped
                    self._end_continuation()
                due = self.pace_s or time.perf_counter() - self._last_publish >= self._frame_s  # (a pace: each)
                if error or not self.playing or due:
                    self._publish(error=error)
                return True
            try:  # a slow pace: wait for the next step, or a command
                command = self._queue.get(timeout=wait)
            except queue.Empty:
                return True
        else:
            command = self._queue.get()
        if isinstance(command, _Quit):
            return False
        error = self._do(command)
        while error is None and not self._queue.empty() and not self._stopping.is_set():
            command = self._queue.get()
            if isinstance(command, _Quit):
                return False
            error = self._do(command)
        self._publish(error=error)
        return True

    def _load(self) -> None:
        # Deferred: these import torch, which must not delay the app's first frame.
        from tokenviz.journey.session import Session
        from tokenviz.model.runner import ModelRunner

        def progress(message: str, fraction: float | None) -> None:
            self._message, self._progress = message, fraction
            self._publish()

        self._publish()
        loaded = self._loader(progress)
        self.session = Session(ModelRunner(loaded), self._settings)
        self._message, self._progress = "prefilling the prompt", None
        self._publish()
        try:
            self._prefill(self.session, self._prompt)
        except TokenvizError as exc:
            self._state, self._message = "ready", "no prompt yet: press e to write one"
            self._start_error = str(exc)
            return
        self._state, self._message = "ready", ""

    def _do(self, command: Command, autoplay: bool = False) -> str | None:
        """Run one command; returns a one-line error or None. A command that can take a while shows
        what is running at once."""
        busy = None if autoplay else BUSY.get(type(command))
        try:
            if isinstance(command, Move) and not autoplay:
                self.playing = False
                if self._forced_total:  # a key that moves the journey takes over from a continuation
                    self._end_continuation()
            if busy is not None and self.session is not None and self.session.records:
                self._busy = busy
                with contextlib.suppress(Exception):  # best effort: the frame after the command reports
                    self._publish()
            self._handle(command)
        except TokenvizError as exc:
            if autoplay:
                self.playing = False
            return str(exc)
        except Exception as exc:  # a bug, not the user's mistake: keep the app alive, log the details
            self.playing = False
            return f"internal error: {exc} ({log_exception()})"
        finally:
            if busy is not None:
                self._busy = None
            if not autoplay:
                self._handled += 1
        if self.session is not None and self.session.stop_reason is not None:
            self.playing = False
        return None

    def _handle(self, command: Command) -> None:
        session = self.session
        if session is None or (not session.records and not isinstance(command, ALLOWED_WITHOUT_JOURNEY)):
            raise TokenvizError("no journey yet: press e to write a prompt")
        if isinstance(command, Move):
            self._move(command, session)
        else:
            self._look(command, session)

    def _move(self, command: Move, session: Session) -> None:
        """A command that changes the journey."""
        if not isinstance(command, Step | Force):
            self._difference = None  # it may be of tokens no longer there (a split knows no more than its position)
        match command:
            case Step(token=token):
                self._step(session, token)
            case Continue(text=text):
                self._continue(session, text)
            case Force(rank=rank):
                self._timed(lambda: session.force_rank(rank))
            case BranchAt(steps_back=steps_back, rank=rank):
                self._timed(lambda: session.branch(steps_back, rank))
            case SwitchBranch(index=index):
                session.switch_branch(index)
            case Rewind(n=n):
                if session.rewind(n) == 0:
                    raise TokenvizError("nothing to rewind: only the prompt is left")
            case Reset():
                session.reset()
            case Start():
                self._prefill(session, command)
                self._prompt = command
                self._step_times.clear()  # tok/s is the new journey's, and so is every view
                self._inspection = self._attribution = self._difference = None
                self._verification = self._beams = self._speculation = None
            case _:
                assert_never(command)

    def _look(self, command: Command, session: Session) -> None:
        """A command that changes the settings, autoplay or what the views show."""
        match command:
            case Adjust(name=name, direction=direction):
                if not session.settings.greedy:
                    self._warm_temperature = session.settings.temperature
                session.set_settings(
                    adjust(session.settings, name, direction, restore_temperature=self._warm_temperature)
                )
            case Play(on=on):
                self.playing = not self.playing if on is None else on
                if self.playing and session.stop_reason is not None and session.check_stop() is not None:
                    self.playing = False
                    raise TokenvizError(f"stopped: {session.stop_reason}; rewind or raise the limit to go on")
            case Pace(delta=delta):
                index = PACES_S.index(self.pace_s) + delta
                self.pace_s = PACES_S[min(max(index, 0), len(PACES_S) - 1)]
            case ShowAttention():
                self._attention_request = command if command.rows > 0 else None
            case Watch(token=token):
                self._watch(session, token)
            case Save(path=path, page_colors=colors):
                snapshot, attention = snapshot_of(session), session.saved_attention()
                written = save_journey(path, snapshot, attention, session.kept_analyses())
                page = save_page(written.with_suffix(".html"), snapshot, attention, colors) if colors else None
                self._notice = f"saved {written}{f' and {page}' if page else ''} (tokenviz replay {written})"
            case _:
                self._compute(command, session)

    def _compute(self, command: Command, session: Session) -> None:
        """A view computed on demand: an inspection, an attribution, a cache check, beams, speculation.
        (The imports below are deferred like _load's: they import torch, and this module is imported
        before the first frame.)"""
        match command:
            case Inspect(position=position):
                self._inspection = session.inspect(position)
            case Attribute(position=position, method=method):
                self._attribute(session, position, method)
            case SplitDifference(position=position):
                self._difference = session.logit_difference(position)
            case Verify():
                from tokenviz.journey.verification import verify_latest

                self._verification = verify_latest(session.runner, session.cached_ids)
            case Beams(width=width, steps=steps):
                from tokenviz.decoding.beams import beam_search

                self._cancel.clear()
                self._beams = beam_search(session.runner, session.ids, width, steps, cancelled=self._cancelled)
            case Speculate(drafter=drafter, steps=steps):
                from tokenviz.decoding.speculation import make_drafter, speculative_decode

                drafting = make_drafter(drafter, session.runner)
                self._cancel.clear()
                self._speculation = speculative_decode(
                    session.runner, session.ids, drafting, steps, session.settings, cancelled=self._cancelled
                )
            case _:
                raise TokenvizError(f"unknown command {command!r}")

    def _attribute(self, session: Session, position: int, method: AttributionMethod) -> None:
        """Attribute the token after `position`, showing leave-one-out's progress; Escape cancels."""

        def progress(done: int, total: int) -> None:
            if done < total:
                self._progress = done / total
                self._message = f"leaving out each token: {done} of {total} (Escape cancels)"
                self._publish()

        self._cancel.clear()
        try:
            self._attribution = session.attribute(position, method, progress, self._cancelled)
        finally:
            self._message, self._progress = "", None

    def _watch(self, session: Session, token: int | str) -> None:
        """Watch a token (or stop), showing the progress of filling in the steps taken; Escape cancels."""

        def progress(done: int, total: int) -> None:
            if done < total:
                self._progress = done / total
                self._message = f"watching: filling in the steps taken, {done} of {total} (Escape cancels)"
                self._publish()

        self._cancel.clear()
        try:
            session.watch(token, progress, self._cancelled)
        finally:
            self._message, self._progress = "", None

    def _prefill(self, session: Session, prompt: Start) -> None:
        """Start `prompt`, showing the prefill's progress chunk by chunk; Escape or quitting cancels it."""

        def progress(done: int, total: int) -> None:
            if done < total:  # the last chunk's frame is the journey itself
                self._busy, self._progress = "prefilling", done / total
                self._message = f"prefilling: {done} of {total} prompt tokens (Escape cancels)"
                self._publish()

        self._cancel.clear()
        message, fraction = self._message, self._progress
        try:
            session.start(prompt.prompt, progress, self._cancelled, chat=prompt.chat, system=prompt.system)
        finally:
            self._busy, self._message, self._progress = None, message, fraction

    def _step(self, session: Session, token: int | None) -> None:
        """Take the pending token, or `token` (a continuation's forced step)."""
        self._timed(lambda: session.step(forced_id=token))
        if self._forced_total:
            done = self._forced_total - len(self._forced)
            self._message = f"continuing with your text: {done} of {self._forced_total} tokens (any move stops it)"

    def _continue(self, session: Session, text: str) -> None:
        """Queue the text's tokens as forced steps; autoplay takes them at its pace."""
        if session.pending is None:
            raise TokenvizError(f"generation has stopped ({session.stop_reason}): rewind to continue from here")
        self._forced.extend(session.runner.encode(text, special_tokens=False))
        if not self._forced:
            raise TokenvizError("type some text to continue with")
        self._forced_total, self.playing = len(self._forced), True

    def _end_continuation(self) -> None:
        self.playing = False
        self._forced.clear()
        self._forced_total, self._message = 0, ""

    def _cancelled(self) -> bool:
        """Asked between the forward passes of a long run: Escape, or quitting, ends it there."""
        return self._cancel.is_set() or self._stopping.is_set()

    def _timed(self, action: Callable[[], object]) -> None:
        """Run one decode step and count it in tok/s (prefills and cache rebuilds are not steps)."""
        started = time.perf_counter()
        action()
        self._step_times.append(time.perf_counter() - started)

    def _publish(self, error: str | None = None) -> None:
        self._seq += 1
        self._last_publish = time.perf_counter()
        try:
            snapshot = self._snapshot(error)
        except Exception as exc:  # the journey is intact: show the last good frame with the error
            self.playing = False
            base = self._last_snapshot or Snapshot(
                seq=0, state=self._state, settings=self._settings, prompt=self._prompt.prompt
            )
            snapshot = dataclasses.replace(
                base,
                seq=self._seq,
                playing=False,
                handled=self._handled,
                error=f"internal error while drawing: {exc} ({log_exception()})",
            )
        self._last_snapshot = snapshot
        self._post(snapshot)

    def _snapshot(self, error: str | None) -> Snapshot:
        s = self.session
        if s is not None and s.records:
            state: EngineState = "playing" if self.playing else ("stopped" if s.stop_reason else "ready")
            journey = snapshot_of(s, seq=self._seq, state=self._busy or state)
        else:
            journey = Snapshot(
                seq=self._seq,
                state=self._busy or self._state,
                info=s.runner.info if s else None,
                settings=s.settings if s else self._settings,
                prompt=self._prompt.prompt,
                chat=self._prompt.chat,
                system=self._prompt.system,
            )
        return dataclasses.replace(
            journey,
            message=self._message,
            progress=self._progress,
            playing=self.playing,
            pace_s=self.pace_s,
            tokens_per_s=len(self._step_times) / sum(self._step_times) if self._step_times else None,
            error=error,
            handled=self._handled,
            inspection=self._inspection,
            attribution=self._attribution,
            logit_difference=self._difference,
            verification=self._verification,
            beams=self._beams,
            speculation=self._speculation,
            notice=self._take_notice(),
            attention=self._attention_view(s),
        )

    def _take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice

    def _attention_view(self, session: Session | None) -> AttentionView | None:
        """The rows the attention pane asked for, computed for the journey as it is now."""
        request = self._attention_request
        if request is None or session is None or not session.records or self._busy:
            return None
        layer, queries = request.resolve(session.runner.kv_len, session.runner.info.layers)
        return self._attention_rows.view(session, layer, queries)
