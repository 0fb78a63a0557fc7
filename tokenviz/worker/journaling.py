"""The app's journey kept in a journal as it goes (tokenviz.files.journal), and one left by a process
that died offered back: said at the next start on the same model, reopened with `--restore`."""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tokenviz.contract.commands import Start
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.text import safe_text
from tokenviz.files.journal import Journal, JournalFollower, JournalWriter, forget, journal_model, orphans, read_journal
from tokenviz.journey.prompt import tokenize

if TYPE_CHECKING:
    from tokenviz.journey.session import Session

RESTORE_OPTION = "--restore"
Prefill = Callable[[Start], None]  # starts a prompt, showing its progress


def model_key(info: ModelInfo) -> str:
    """What makes two runs the same model for a journal: its name, the runtime and dtype it ran in (the
    same GGUF in llama.cpp and in transformers gives other numbers), and whom its steps are requests to."""
    runtime = info.runtime.split(" ", 1)[0] or "unknown"
    key = f"{info.name} ({runtime}, {info.dtype})"
    return f"{key}, requests to {info.requests}" if info.requests else key


def at(seconds: float) -> str:
    """A moment as the user's clock says it: "at 2026-11-29 08:40"."""
    return time.strftime("at %Y-%m-%d %H:%M", time.localtime(seconds))


def _nothing_to_restore(key: str, kept: dict[Path, str | None]) -> str:
    """Why --restore has nothing to take: no journal left, or those left are of another model or runtime
    (named, so the user can start tokenviz as that journey was)."""
    others = sorted({model for model in kept.values() if model is not None})
    if not others:
        return f"no journey of {safe_text(key)} to restore: none was left by a process that died"
    return (
        f"no journey of {safe_text(key)} to restore; the journeys left are of {safe_text('; '.join(others[:3]))}: "
        "start tokenviz with that model, backend and dtype, and --restore"
    )


_writing: weakref.WeakSet[JournalWriter] = weakref.WeakSet()  # the journals this process writes


def keep_journals() -> None:
    """The process is ending without the user quitting (SIGTERM, SIGHUP: a kill, a closed terminal): its
    journals stay, each offered at the next start on its model and taken again by --restore (their exit
    handlers then find nothing to remove)."""
    for writer in list(_writing):
        writer.keep()


class Journaling:
    """The journal of one worker's journey: opened once the model has loaded; the orphan of the same
    model restored first where asked. A journal ends with the process's orderly exit (atexit)."""

    def __init__(self, folder: Path, restore: bool = False) -> None:
        self.folder = folder
        self.restore = restore
        self._follower: JournalFollower | None = None

    def open(self, session: Session, prefill: Prefill, say: Callable[[str], None]) -> str | None:
        """Start the journal of `session`'s model. With `restore`, reopen the newest journal of it
        that a dead process left (prefilled through `prefill`) and return the line that says so;
        without, return a line that offers it, or None."""
        key = model_key(session.engine.info)
        try:
            kept = {path: journal_model(path) for path in orphans(self.folder)}
        except OSError:
            kept = {}
        left = [path for path, model in kept.items() if model == key]
        line, restored = None, None
        if self.restore and not left:
            raise TokenvizError(_nothing_to_restore(key, kept))
        if self.restore:
            journal = read_journal(left[0])
            try:
                self._replay(session, journal, prefill, say)
            except TokenvizError as exc:  # what could be taken again stays; the journal too
                line = f"restoring stopped part way: {exc}"
            else:
                restored = journal.path
                taken = len(session.generated_ids)
                line = f"restored the journey begun {at(journal.started)}: {taken} tokens, each taken again"
        elif left:
            line = (
                f"a journey on this model was left when its process died {at(left[0].stat().st_mtime)}: "
                f"start tokenviz with {RESTORE_OPTION} to reopen it"
            )
        try:
            writer = JournalWriter(self.folder, key)
        except OSError as exc:  # a cache that cannot be written: the journey goes on, unjournaled
            return f"the journey is not kept in a journal: {safe_text(str(exc))}"
        atexit.register(writer.discard)
        _writing.add(writer)
        self._follower = JournalFollower(writer)
        self.follow(session, moved=True)
        if restored is not None:  # only now: the journey is in the new journal, and on its way to the screen
            forget(restored)
        return line

    def follow(self, session: Session, moved: bool) -> None:
        """Write what changed since the last look (`moved`: the path may have changed before its end)."""
        if self._follower is None or not session.records:
            return
        begun = (session.prompt, session.chat, session.system)
        ids, prompt_len = session.ids, len(session.prompt_ids)  # the path as it is: no copy of it
        self._follower.follow(begun, session.settings, session.interventions, ids, moved, prompt_len)

    @staticmethod
    def _check_prompt(session: Session, journal: Journal) -> None:
        """The prompt taken again must give the tokens it gave then (a tokenizer changed since would not)."""
        then = journal.prompt.ids
        if then is not None and then != session.prompt_ids:
            raise TokenvizError(
                f"its prompt gives other tokens now ({len(then):,} then, {len(session.prompt_ids):,} now): "
                "the journal is kept as it is"
            )

    @staticmethod
    def _replay(
        session: Session, journal: Journal, prefill: Callable[[Start], None], say: Callable[[str], None]
    ) -> None:
        """The journal's journey again: its prompt under the settings and interventions of its start,
        then each token forced under those in force when it was taken."""
        begun = journal.prompt
        session.set_settings(journal.settings)
        if journal.interventions:
            ids = tokenize(session.engine, begun.prompt, begun.chat, begun.system)[1]
            session.set_interventions(journal.interventions, context=ids)
        prefill(Start(begun.prompt, begun.chat, begun.system))
        Journaling._check_prompt(session, journal)
        for i, taken in enumerate(journal.taken):
            say(f"restoring the journey: {i} of {len(journal.taken)} tokens")
            if taken.interventions != session.interventions:
                session.set_interventions(taken.interventions)
            if taken.settings != session.settings:
                session.set_settings(taken.settings)
            if session.pending is None:
                break  # it had stopped there
            session.step(forced_id=taken.token)
        session.set_settings(journal.final_settings)
        if journal.final_interventions != session.interventions:
            session.set_interventions(journal.final_interventions)
