"""The engine thread: one long-lived thread owns the model, its cache and the session.

Commands arrive through a queue and run one at a time, in order, so a storm of keys can never
run two forward passes at once or interleave with a half-done step. After the queue is drained the
thread publishes one frozen Snapshot through `post` (Textual's post_message is thread-safe).
No textual import here: `post` is any callable.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from tokenviz.controls import adjust
from tokenviz.errors import TokenvizError
from tokenviz.records import ModelInfo, StepRecord, TokenChip
from tokenviz.settings import SamplingSettings

# Commands that change the journey pause autoplay first; settings and view changes do not.
PAUSING = {"step", "rewind", "force", "branch", "switch_branch", "reset", "start"}
FRAME_S = 1 / 60


@dataclass(frozen=True)
class Snapshot:
    """Everything the panes show, as plain data, at one moment."""

    seq: int
    state: str  # loading, ready, stepping, playing, stopped, error
    message: str = ""
    progress: float | None = None
    info: ModelInfo | None = None
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    prompt: str = ""
    chips: tuple[TokenChip, ...] = ()
    prompt_len: int = 0
    records: tuple[StepRecord, ...] = ()
    stop_reason: str | None = None
    playing: bool = False
    tokens_per_s: float | None = None
    error: str | None = None  # one line, for a notification
    handled: int = 0  # commands handled before this snapshot (tests wait on it)
    inspection: Any = None  # engine.internals.Inspection of the last inspected position
    verification: Any = None  # session.Verification of the last verify
    cache_event: Any = None  # session.CacheEvent of the last rewind
    live: bool = True  # False for a recording: nothing can run the model
    beams: Any = None  # beams.BeamResult of the last beam search
    speculation: Any = None  # speculate.Speculation of the last speculative run
    branches: tuple = ()  # session.BranchSummary: the current path first, then the others
    text: str = ""  # the generated text, decoded
    full_text: str = ""  # prompt and generated text, decoded

    @property
    def pending(self) -> StepRecord | None:
        return self.records[-1] if self.records and self.stop_reason is None else None

    @property
    def latest(self) -> StepRecord | None:
        return self.records[-1] if self.records else None


def snapshot_of(session, seq: int = 1, **fields) -> Snapshot:
    """The journey of `session` as a Snapshot (the trace and the exporter use it too)."""
    s = session
    state = "stopped" if s.stop_reason else "ready"
    return Snapshot(
        seq=seq, state=fields.pop("state", state), info=s.runner.info, settings=s.settings, prompt=s.prompt,
        chips=tuple(s.chips()), prompt_len=len(s.prompt_ids), records=tuple(s.records),
        stop_reason=s.stop_reason, cache_event=s.last_cache_event, text=s.generated_text, full_text=s.text,
        branches=tuple(s.branch_summaries()) if s.branches else (),
        **fields,
    )


class EngineBridge:
    def __init__(self, post: Callable[[Snapshot], Any], loader: Callable, settings: SamplingSettings, prompt: str):
        self._post = post
        self._loader = loader
        self._prompt = prompt
        self._settings = settings
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tokenviz-engine", daemon=True)
        self._stopping = threading.Event()
        self.submitted = 0  # commands sent (UI thread)
        self._handled = 0  # commands done (engine thread)
        self.session = None
        self.playing = False
        self._seq = 0
        self._state = "loading"
        self._message = "starting"
        self._progress: float | None = None
        self._step_times: deque[float] = deque(maxlen=16)
        self._warm_temperature = settings.temperature or 0.7  # what greedy-off returns to
        self._start_error: str | None = None
        self._last_publish = 0.0
        self._inspection = None
        self._verification = None
        self._beams = None
        self._speculation = None
        self.forwards_in_flight = 0  # tests assert this never exceeds 1
        self.max_forwards_in_flight = 0

    # ---- called from the UI thread ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, command: str, **args) -> None:
        self.submitted += 1
        self._queue.put((command, args))

    def stop(self, timeout: float = 1.0) -> None:
        self._stopping.set()
        self._queue.put(("quit", {}))
        self._thread.join(timeout)

    # ---- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except TokenvizError as exc:
            self._state, self._message = "error", str(exc)
            self._publish(error=str(exc))
            return
        except Exception as exc:  # not foreseeable: one line, and the traceback in the log
            self._state, self._message = "error", f"internal error while loading: {exc}"
            self._publish(error=self._message, log=traceback.format_exc())
            return
        self._publish(error=self._start_error)
        while not self._stopping.is_set():
            if self.playing and self._queue.empty():
                error = self._do("step", {}, autoplay=True)
                # Faster than the eye: publish at most one frame per FRAME_S, and always the last.
                if error or not self.playing or time.perf_counter() - self._last_publish >= FRAME_S:
                    self._publish(error=error)
                continue
            command, args = self._queue.get()
            if command == "quit":
                return
            error = self._do(command, args)
            while error is None and not self._queue.empty() and not self._stopping.is_set():
                command, args = self._queue.get()
                if command == "quit":
                    return
                error = self._do(command, args)
            self._publish(error=error)

    def _load(self) -> None:
        from tokenviz.engine.runner import ModelRunner
        from tokenviz.session import Session

        def progress(message: str, fraction: float | None) -> None:
            self._message, self._progress = message, fraction
            self._publish()

        self._publish()
        loaded = self._loader(progress)
        self.session = Session(ModelRunner(loaded), self._settings)
        self._message, self._progress = "prefilling the prompt", None
        self._publish()
        try:
            self.session.start(self._prompt)
        except TokenvizError as exc:
            self._state, self._message = "ready", "no prompt yet: press e to write one"
            self._start_error = str(exc)
            return
        self._state, self._message = "ready", ""

    def _do(self, command: str, args: dict, autoplay: bool = False) -> str | None:
        """Run one command; returns a one-line error or None."""
        try:
            return self._handle(command, args, autoplay)
        finally:
            if not autoplay:
                self._handled += 1

    def _handle(self, command: str, args: dict, autoplay: bool) -> str | None:
        session = self.session
        if command in PAUSING and not autoplay:
            self.playing = False
        try:
            if session is None or (not session.records and command not in ("start", "settings", "adjust")):
                raise TokenvizError("no journey yet: press e to write a prompt")
            if command == "step":
                self._forward(session.step)
            elif command == "force":
                self._forward(lambda: session.force_rank(args["rank"]))
            elif command == "branch":
                self._forward(lambda: session.branch(args["steps_back"], args["rank"]))
            elif command == "switch_branch":
                self._forward(lambda: session.switch_branch(args["index"]))
            elif command == "rewind":
                if session.rewind(args.get("n", 1)) == 0:
                    raise TokenvizError("nothing to rewind: only the prompt is left")
            elif command == "reset":
                self._forward(lambda: session.start(session.prompt))
            elif command == "start":
                self._forward(lambda: session.start(args["prompt"]))
                self._prompt = args["prompt"]
            elif command == "settings":
                session.set_settings(args["settings"])
            elif command == "adjust":
                if not session.settings.greedy:
                    self._warm_temperature = session.settings.temperature
                session.set_settings(adjust(session.settings, args["name"], args.get("direction", 1),
                                            restore_temperature=self._warm_temperature))
            elif command in ("play", "toggle_play"):
                self.playing = not self.playing if command == "toggle_play" else True
                if self.playing and session.stop_reason is not None and session.check_stop() is not None:
                    self.playing = False
                    raise TokenvizError(f"stopped: {session.stop_reason}; rewind or raise the limit to go on")
            elif command == "pause":
                self.playing = False
            elif command == "inspect":
                self._inspection = session.inspect(args["position"])
            elif command == "verify":
                self._verification = session.verify()
            elif command == "beams":
                from tokenviz.beams import beam_search

                self._beams = beam_search(session.runner, session.ids, args["width"], args.get("steps", 10))
            elif command == "speculate":
                from tokenviz.speculate import make_drafter, speculative_decode

                self._speculation = speculative_decode(session.runner, session.ids,
                                                       make_drafter(args["drafter"], session.runner),
                                                       args.get("steps", 16), session.settings)
            else:
                raise TokenvizError(f"unknown command {command!r}")
        except TokenvizError as exc:
            if autoplay:
                self.playing = False
            return str(exc)
        except Exception as exc:  # a bug, not the user's mistake: keep the app alive, log the details
            self.playing = False
            _write_log(traceback.format_exc())
            return f"internal error: {exc} (details in {_log_path()})"
        if session.stop_reason is not None:
            self.playing = False
        return None

    def _forward(self, action: Callable) -> None:
        self.forwards_in_flight += 1
        self.max_forwards_in_flight = max(self.max_forwards_in_flight, self.forwards_in_flight)
        started = time.perf_counter()
        try:
            action()
        finally:
            self.forwards_in_flight -= 1
        self._step_times.append(time.perf_counter() - started)

    def _publish(self, error: str | None = None, log: str | None = None) -> None:
        self._seq += 1
        self._last_publish = time.perf_counter()
        s = self.session
        rate = len(self._step_times) / sum(self._step_times) if self._step_times else None
        common = dict(message=self._message, progress=self._progress, playing=self.playing, tokens_per_s=rate,
                      error=error, handled=self._handled, inspection=self._inspection,
                      verification=self._verification, beams=self._beams,
                      speculation=self._speculation)
        if s is not None and s.records:
            state = "playing" if self.playing else ("stopped" if s.stop_reason else "ready")
            snapshot = snapshot_of(s, seq=self._seq, state=state, **common)
        else:
            snapshot = Snapshot(seq=self._seq, state=self._state, info=s.runner.info if s else None,
                                settings=s.settings if s else self._settings, prompt=self._prompt, **common)
        if log:
            _write_log(log)
        self._post(snapshot)


def _log_path():
    from tokenviz.engine.loading import cache_root

    return cache_root() / "tokenviz.log"


def _write_log(text: str) -> None:
    try:
        path = _log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(text + "\n")
    except OSError:
        pass


class FrozenBridge:
    """Serves one recorded Snapshot: every pane works, nothing runs a model.

    Used for replaying a saved journey and for deterministic screenshots in tests.
    """

    def __init__(self, post: Callable[[Snapshot], Any], snapshot: Snapshot, **_ignored):
        self._post = post
        self.snapshot = dataclasses.replace(snapshot, live=False)
        self.submitted = 0

    def start(self) -> None:
        self._post(self.snapshot)

    def submit(self, command: str, **args) -> None:
        self.submitted += 1
        self.snapshot = dataclasses.replace(
            self.snapshot, seq=self.snapshot.seq + 1, handled=self.submitted,
            error="this journey is a recording: nothing runs a model here",
        )
        self._post(self.snapshot)

    def stop(self, timeout: float = 0.0) -> None:
        pass
