"""The journey's worker: the engine thread that owns the model, its cache and the session.

The thread's shape (queue, guard, autoplay, frame-paced publishing) is worker.thread's; this module
says what each command does to the journey and which on-demand results the snapshots carry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, assert_never

from tokenviz.contract.backend import OpenEngine
from tokenviz.contract.commands import (
    AddSae,
    Adjust,
    Assign,
    Attribute,
    Beams,
    BranchAt,
    Command,
    Constrain,
    Continue,
    Force,
    Intervene,
    LabelFeatures,
    Move,
    Pace,
    Play,
    ReadFeatures,
    Request,
    Reset,
    Rewind,
    Save,
    ShowAttention,
    ShowLens,
    Speculate,
    SplitDifference,
    Start,
    Step,
    SwitchBranch,
    Verify,
    Watch,
)
from tokenviz.contract.engine import Capability
from tokenviz.contract.errors import GiveWay, TokenvizError
from tokenviz.contract.features import is_feature_watch
from tokenviz.contract.interventions import Entries
from tokenviz.contract.lens_layers import LensLayers
from tokenviz.contract.presets import assigned
from tokenviz.contract.records import TokenChip
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import CANCELS, EngineState, Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.decoding.nudges import Nudges
from tokenviz.files.journey_file import save_journey
from tokenviz.files.journey_page import save_page
from tokenviz.journey.branches import with_branch_source
from tokenviz.journey.prompt import tokenize
from tokenviz.journey.stops import how_to_go_on
from tokenviz.render.units import duration
from tokenviz.worker.comparing import CompareWorker
from tokenviz.worker.continuation import Continuation
from tokenviz.worker.errorlog import log_exception
from tokenviz.worker.journaling import Journaling
from tokenviz.worker.meanwhile import Meanwhile
from tokenviz.worker.snapshots import saved_attention_of, snapshot_of
from tokenviz.worker.step_times import JobPace, StepTimes, WholeTime
from tokenviz.worker.thread import CommandThread
from tokenviz.worker.view_results import ViewResults

if TYPE_CHECKING:
    from tokenviz.contract.backend import Progress
    from tokenviz.contract.results import ViewResult
    from tokenviz.journey.comparison import Comparison
    from tokenviz.journey.session import Session

ALLOWED_WITHOUT_JOURNEY = (Start, Adjust, Assign, Constrain, Intervene, ShowAttention, ShowLens, AddSae)
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
    ReadFeatures: "reading features",
    LabelFeatures: "reading features",
    AddSae: "reading features",
    Watch: "watching",
    SplitDifference: "watching",
}


class EngineWorker(CommandThread[Snapshot]):
    thread_name = "tokenviz-engine"

    def __init__(
        self,
        loader: OpenEngine,
        settings: SamplingSettings,
        prompt: str,
        chat: bool = False,
        system: str | None = None,
        lens_layers: LensLayers | None = None,
        journaling: Journaling | None = None,
        sae_folders: tuple[str, ...] = (),
    ):
        super().__init__()
        self._sae_folders = sae_folders  # the SAEs to load beside the model (--sae)
        self._lens_layers = lens_layers
        self._journaling = journaling  # the journey kept in a journal as it goes (None: not kept)
        self._loader = loader
        self._prompt = Start(prompt, chat, system)
        self._settings = settings
        self._nudges = Nudges(settings)
        self._interventions: Entries = ()  # listed, each on or off (see Intervene)
        self._busy: EngineState | None = None  # shown instead of the journey's state while set
        self.session: Session | None = None
        self._progress: float | None = None
        self._step_times = StepTimes()  # tok/s, of the last steps
        self._views = ViewResults(self._compute)  # what the views show that this thread computes
        self._continuation = Continuation()  # a text's tokens forced at autoplay's pace (see Continue)
        self._prefilling: tuple[TokenChip, ...] = ()  # a first prompt's tokens while it is prefilled
        self._give_way: Callable[[], bool] | None = None  # asked inside an autoplay step (see _handle)
        self._meanwhile = Meanwhile(self._said_meanwhile)  # a wait past a second says what it waits on
        self._whole_time = WholeTime()  # the last step's whole time, to its frame, and its parts

    def count_tokens(self, text: str) -> int | None:
        session = self.session  # a fast tokenizer is safe to call beside the engine's thread; a server is not asked
        if session is None or Capability.TOKENIZER.value not in session.engine.info.capabilities:
            return None
        return len(session.engine.encode(text))

    def compare(self, a: SamplingSettings, b: SamplingSettings, prompt: Start) -> CompareWorker:
        """Two journeys of `prompt` on this worker's model (weights shared), by settings `a` and `b`."""
        session = self.session
        if session is None:
            raise TokenvizError("the model has not loaded yet")
        if a == b:
            raise TokenvizError("compare needs the two journeys to differ: change at least one setting")
        engine, shared = session.engine, session.interventions  # hooked into the weights both twins use

        def build(progress: Progress) -> Comparison:
            from tokenviz.journey.comparison import Comparison
            from tokenviz.journey.session import Session

            sides = Session(engine.twin(), a), Session(engine.twin(), b)
            for side in sides:
                side.shared_interventions = shared
            return Comparison(*sides)

        return CompareWorker(build, prompt.prompt, chat=prompt.chat, system=prompt.system)

    # ---- loading -----------------------------------------------------------------------------------

    def _load(self) -> None:
        self._message = "importing torch and transformers"  # seconds, before the loader can say more
        self._publish()
        # Deferred: these import torch, which must not delay the app's first frame.
        from tokenviz.journey.session import Session

        def progress(message: str, fraction: float | None) -> None:
            """What the backend says, the one way it says it: while it loads, the loading line; after, a
            line in the status line (a busy server retried), from this thread or from a timer's while a
            request waits."""
            if self.session is None:
                self._message, self._progress = message, fraction
                self._publish()
            elif threading.current_thread() is self._thread:
                self._say(message)
            else:
                self._said_meanwhile(message)

        self.session = Session(self._loader(progress), self._settings)
        self.session.analyses.lens_layers = self._lens_layers  # a layer the model lacks: said in the lens view
        if self._sae_folders:
            from tokenviz.journey.feature_readings import add_saes

            for folder in self._sae_folders:
                add_saes(self.session, folder)
        self._message, self._progress = "prefilling the prompt", None
        self._cancels_from_now()
        self._publish()
        try:
            self._start_journey(self.session)
        except TokenvizError as exc:
            self._state, self._message = "ready", "no prompt yet: press e to write one"
            self._start_error = str(exc)
            return
        self._views.after(self.session)
        self._state, self._message = "ready", ""

    def _start_journey(self, session: Session) -> None:
        """The prompt given, or the journey a journal kept (--restore); then its journal from here."""
        journaling = self._journaling
        if journaling is None:
            self._prefill(session, self._prompt)
            return

        def prefill(start: Start) -> None:
            self._prefill(session, start)
            self._prompt = start

        def say(line: str) -> None:
            self._busy, self._message = "stepping", line
            self._publish()

        if not journaling.restore:
            self._prefill(session, self._prompt)
        try:
            self._notice = journaling.open(session, prefill, say)
        except TokenvizError as exc:  # nothing to restore: the prompt given instead
            if not journaling.restore:
                raise
            journaling.restore = False
            self._start_error = str(exc)
            self._start_journey(session)
        finally:
            self._busy = None

    # ---- the loop's hooks --------------------------------------------------------------------------

    def _autostep(self) -> Command:
        return Step(self._continuation.next_token())

    def _after_autostep(self) -> None:
        if self._continuation.active and (self._continuation.through or not self.playing):  # through, or stopped
            self._end_continuation()

    def _pauses(self, command: Command) -> bool:
        return isinstance(command, Move)

    def _pause(self) -> None:
        self.playing = False
        if self._continuation.active:  # a key that moves the journey takes over from a continuation
            self._end_continuation()

    def _ended(self) -> bool:
        return self.session is not None and self.session.stop_reason is not None

    def _handle(self, command: Command, autoplay: bool) -> None:
        """Run one command. One that can take a while shows what is running at once."""
        session = self.session
        if session is None or (not session.records and not isinstance(command, ALLOWED_WITHOUT_JOURNEY)):
            raise TokenvizError("no journey yet: press e to write a prompt")
        busy = None if autoplay else BUSY.get(type(command))
        if isinstance(command, Move | Intervene):
            self._whole_time.begin()
        if busy is not None and session.records:
            self._busy = busy
            with contextlib.suppress(Exception):  # best effort: the frame after the command reports
                self._publish()
        # An autoplay step gives way to a key pressed meanwhile, between two of its layers (Session.step).
        self._give_way = self._command_waiting if autoplay else None
        try:
            if isinstance(command, Move):
                self._move(command, session)
            else:
                self._look(command, session)
            if autoplay:  # the standing views' work is here, step by step: a frame only reads it
                self._views.after(session, paged=True)
                self._whole_time.end(self._views.took)
            else:  # after every command queued, once (see _settle)
                self._views.due = True
            if self._journaling is not None:  # a step adds a line; a rewind or a branch compares the path
                self._journaling.follow(session, moved=isinstance(command, Move) and not isinstance(command, Step))
        except GiveWay:
            if isinstance(command, Step) and command.token is not None:  # a continuation's token: again next
                self._continuation.again(command.token)
            self._whole_time.drop()
            raise
        finally:
            self._busy = None
            self._give_way = None

    # ---- commands ------------------------------------------------------------------------------------

    def _move(self, command: Move, session: Session) -> None:
        """A command that changes the journey."""
        if not isinstance(command, Step | Force):
            self._views.results.pop(SplitDifference, None)  # it may be of tokens no longer there
        match command:
            case Step(token=token):
                self._step(session, token)
            case Continue(text=text):
                self._continue(session, text)
            case Force(rank=rank):
                self._timed(lambda: session.take_rank(rank))
            case BranchAt(steps_back=steps_back, rank=rank):
                self._timed(lambda: session.take_rank(rank, steps_back))
            case SwitchBranch(index=index):
                session.switch_branch(index)
            case Rewind(n=n):
                if session.rewind(n) == 0:
                    raise TokenvizError("nothing to rewind: only the prompt is left")
            case Reset():
                session.reset()
                self._step_times.clear()  # the rate said is of steps on screen: none now
            case Start():
                self._prefill(session, command)
                self._prompt = command
                self._step_times.clear()  # tok/s is the new journey's, and so is every view
                self._views.forget()
            case _:
                assert_never(command)

    def _look(self, command: Command, session: Session) -> None:
        """A command that changes the settings, autoplay or what the views show."""
        match command:
            case Adjust(name=name, direction=direction):
                session.set_settings(self._nudges.apply(session.settings, name, direction))
            case Assign(assignments=assignments):
                session.set_settings(assigned(session.settings, assignments))
            case Intervene(entries=entries):
                self._intervene(session, entries)
            case Constrain(grammar=grammar):
                session.set_settings(session.settings.replace(grammar=grammar))
                self._notice = f"grammar: {grammar.label}" if grammar else "grammar cleared"
            case Play(on=on):
                self._play(session, on)
            case Pace(delta=delta):
                self._step_pace(delta)
            case ShowAttention() | ShowLens():
                self._views.stand(command)
            case Watch(token=token):
                self._watch(session, token)
            case AddSae(folder=folder):
                self._add_sae(session, folder)
            case Save():
                self._save(session, command)
            case Request():
                self._views.run(command, session)
            case _:
                raise TokenvizError(f"unknown command {command!r}")

    def _compute(self, request: Request[Any], session: Session) -> ViewResult:
        """A view's result, computed through its spec (tokenviz.journey.views, as `trace` computes
        it), its progress shown (a quick one's wait said past a second); Escape cancels it. (The import
        is deferred like _load's: it imports torch, and this module is imported before the first frame.)"""
        from tokenviz.journey.views import spec_of

        spec = spec_of(session, request)
        job = spec.job(request)
        if not job:
            with self._meanwhile.saying(f"computing {spec.name}"):
                return spec.compute(session, request, lambda done, total: None, self._cancelled)
        with self._job(job, unit=spec.unit) as progress:
            return spec.compute(session, request, progress, self._cancelled)

    def _play(self, session: Session, on: bool | None) -> None:
        self.playing = not self.playing if on is None else on
        if self.playing and session.stop_reason is not None and session.check_stop() is not None:
            self.playing = False
            reason = session.stop_reason
            raise TokenvizError(f"stopped: {reason}; to go on, {how_to_go_on(reason)}")

    def _save(self, session: Session, command: Save) -> None:
        session.score_prompt()  # a journey file keeps the prompt's predictions
        snapshot, attention = snapshot_of(session), saved_attention_of(session)
        written = save_journey(command.path, snapshot, attention, session.analyses.kept())
        lens = session.analyses.kept_inspections  # asked only where a page is written
        html, colors = written.with_suffix(".html"), command.page_colors
        page = save_page(html, snapshot, attention, colors, command.page_view, lens=lens()) if colors else None
        self._notice = f"saved {written}{f' and {page}' if page else ''} (tokenviz replay {written})"

    def _intervene(self, session: Session, entries: Entries) -> None:
        from tokenviz.features.feature_edits import with_sae  # deferred: it imports torch

        # A patch from a branch takes its tokens, once; a feature's, its SAE's layer and folder.
        entries = tuple((with_sae(with_branch_source(i, session.branches), session.saes), on) for i, on in entries)
        started = time.perf_counter()
        what = "changing the model: the journey's tokens run again through it"
        with self._meanwhile.saying(what, " tokens") as progress:
            session.set_interventions([i for i, on in entries if on], progress=progress)
        self._whole_time.count("the model changed", (time.perf_counter() - started) * 1e3)
        self._interventions = entries
        self._views.results.clear()  # every view's result was of the model as it was
        on = sum(on for _, on in entries)
        self._notice = f"interventions: {on} on, {len(entries) - on} off" if entries else "no interventions"

    def _add_sae(self, session: Session, folder: str) -> None:
        from tokenviz.journey.feature_readings import add_saes  # deferred: it imports torch

        added = add_saes(session, folder, "the SAE")
        self._views.results.clear()  # the features view reads every SAE loaded
        names = ", ".join(sae.name for sae in added)
        self._notice = f"SAE added: {names} (layer {added[0].layer}); F shows the features at the cursor"

    def _watch(self, session: Session, token: int | str) -> None:
        """Watch a token (or stop), showing the progress of filling in the steps taken; Escape cancels. A
        feature (feature:SAE:ID) is read when the features view shows it."""
        if is_feature_watch(token):
            from tokenviz.journey.feature_readings import watch_feature  # deferred: it imports torch

            self._notice = watch_feature(session, str(token))
            self._views.results.clear()  # the features view's answer holds what is watched
            return
        with self._job("watching: filling in the steps taken") as progress:
            session.watch(token, progress, self._cancelled)

    def _prefill(self, session: Session, prompt: Start) -> None:
        """Start `prompt`, showing the prefill's progress chunk by chunk; Escape or quitting cancels it."""
        message, fraction = self._message, self._progress
        tokenized = None
        if not session.records:  # nothing on screen yet: the prompt's tokens are, at once
            from tokenviz.journey.chips import token_chips  # deferred, as _load's

            tokenized = tokenize(session.engine, prompt.prompt, prompt.chat, prompt.system)
            _, ids, template = tokenized
            session.engine.pieces.learn(ids)  # in one call
            self._prefilling = tuple(token_chips(session.engine, ids, len(ids), template))
        try:
            with self._job("prefilling", unit=" prompt tokens", busy="prefilling") as progress:
                session.start(
                    prompt.prompt,
                    progress,
                    self._cancelled,
                    chat=prompt.chat,
                    system=prompt.system,
                    defer_predictions=True,  # made when the engine is idle: see _background
                    tokenized=tokenized,  # tokenized once
                )
        finally:
            self._message, self._progress = message, fraction
            self._prefilling = ()

    def _background(self) -> bool:
        """The prompt's predictions at every position, a prefill chunk at a time between keys: the first
        decision came without waiting for them; the surprisal shading and the prompt's next-token pane
        fill in as they come."""
        session = self.session
        if session is None or not session.deferred.left or self.playing:
            return False
        left = session.score_prompt(chunks=1)
        total = len(session.prompt_ids) - 1
        self._message = f"the prompt's predictions: {total - left} of {total} positions" if left else ""
        return True

    def _say(self, line: str) -> None:
        """A line in the status line while the engine waits (a busy server, retried): the frame after
        the command replaces it."""
        self._message = line
        self._publish()

    @contextlib.contextmanager
    def _job(self, what: str, unit: str = "", busy: EngineState | None = None) -> Iterator[Callable[[int, int], None]]:
        """A long job's progress callback: "what: N of M<unit> · about T left (Escape cancels)", in the
        status line and the job's view, with `busy` as the state shown meanwhile. The time left is
        the pace since the first unit scaled by what is left (see time_left)."""
        pace = JobPace()

        def progress(done: int, total: int) -> None:
            if done >= total:  # the frame after the job shows its result
                return
            seconds = pace.left_after(done, total)
            left = f" · about {duration(seconds)} left" if seconds is not None else ""
            self._busy = busy or self._busy
            self._progress = done / total
            self._message = f"{what}: {done} of {total}{unit}{left} {CANCELS}"
            self._publish()

        try:
            yield progress
        finally:
            self._message, self._progress = "", None
            if busy is not None:
                self._busy = None

    def _step(self, session: Session, token: int | None) -> None:
        """Take the pending token, or `token` (a continuation's forced step)."""
        self._timed(lambda: session.step(forced_id=token, give_way=self._give_way))
        if self._continuation.active:
            self._message = self._continuation.line()

    def _continue(self, session: Session, text: str) -> None:
        """Queue the text's tokens as forced steps; autoplay takes them at its pace."""
        if session.pending is None:
            raise TokenvizError(f"generation has stopped ({session.stop_reason}): rewind to continue from here")
        self._continuation.begin(session.engine.encode(text, special_tokens=False))
        self.playing = True

    def _end_continuation(self) -> None:
        self.playing = False
        self._continuation.end()
        self._message = ""

    def _timed(self, action: Callable[[], object]) -> None:
        """Run one decode step and count it in tok/s (see StepTimes) and in the step's parts."""
        session = self.session
        self._step_times.timed(action, lambda: session.records if session is not None else ())
        if session is not None and session.records:  # the pass just run, and the decision made on its logits
            latest = session.records[-1]
            self._whole_time.count("request" if session.engine.info.requests else "forward", latest.forward_ms)
            self._whole_time.count("sampling", latest.decision.ms)

    def _settle(self) -> str | None:
        """The standing views' passes, once after every command queued (not once each: ten rewinds
        make one attention pass), each wait said past a second; then the commands' whole time."""
        session = self.session
        try:  # (autoplay pages the attention rows' window; a frame at rest has them whole)
            if session is not None and (self._views.due or self._views.paged != self.playing):
                self._views.after(session, self._meanwhile.saying, self.playing, give_way=self._command_waiting)
        except TokenvizError as exc:
            return safe_text(str(exc))
        except Exception as exc:  # a bug, not the user's mistake: the journey stays, the details go to the log
            return safe_text(f"internal error: {exc} ({log_exception()})")
        finally:
            self._whole_time.end(self._views.took)
        return None

    # ---- snapshots -----------------------------------------------------------------------------------

    def _snapshot(self, error: str | None) -> Snapshot:
        """The frame: the journey and the worker's own fields, built once (the app is handed it whole)."""
        s = self.session
        worker = self._worker_fields(s, error)
        if s is not None and s.records:
            state: EngineState = "playing" if self.playing else ("stopped" if s.stop_reason else "ready")
            return snapshot_of(s, seq=self._seq, state=self._busy or state, **worker)
        return self._before_the_journey(s, worker)

    def _before_the_journey(self, s: Session | None, worker: dict[str, Any]) -> Snapshot:
        """A frame while the model loads or the prompt's prefill runs: the prompt's tokens where known."""
        return Snapshot(
            seq=self._seq,
            state=self._busy or self._state,
            info=s.engine.info if s else None,
            settings=s.settings if s else self._settings,
            prompt=self._prompt.prompt,
            chat=self._prompt.chat,
            system=self._prompt.system,
            chips=self._prefilling,  # the first prompt's tokens, known before its prefill ends
            prompt_len=len(self._prefilling),
            **worker,
        )

    def _worker_fields(self, s: Session | None, error: str | None) -> dict[str, Any]:
        """What a frame says of the worker itself: its message, pace, rates, results and notices."""
        return {
            "message": self._message,
            "progress": self._progress,
            "playing": self.playing,
            "pace_s": self.pace_s,
            **self._step_times.fields(),
            "error": error,
            "handled": self._handled,
            "notice": self._notice,
            **self._views.fields(bool(self._busy)),
            "interventions": self._interventions,
            "took": self._whole_time.took,
        }

    def _fallback(self, error: str) -> Snapshot:
        base = self._last_snapshot or Snapshot(
            seq=0, state=self._state, settings=self._settings, prompt=self._prompt.prompt
        )
        state: EngineState = "ready" if base.state == "playing" else base.state  # autoplay stopped with it
        return dataclasses.replace(base, seq=self._seq, state=state, playing=False, handled=self._handled, error=error)
