"""A journey's journal: what the user made, a line at a time, so a process that dies (a crash
inside a native runtime such as llama.cpp, a kill, a power cut to the terminal) leaves it behind.
The next start on the same model says so, and `--restore` reopens it: the prompt, then each token
forced under the settings and interventions in force when it was taken.

One JSON object a line: the header first ({"format", "model", "started"}), then {"start": ...}
(a prompt), {"settings": ..., "grammars": ...} and {"interventions": [...]} when they change,
{"token": id} a token taken, {"cut": n} the path cut back to n generated tokens. Appending costs a
line a step, never the journey's length. A journal holds a lock while its process lives; one whose
lock is free was left by a process that died. A line the death cut short is left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tokenviz.contract.bounds import MAX_TOKENS, Count, Flag, Text
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import MAX_INTERVENTIONS, Intervention, intervention_from_json
from tokenviz.contract.settings import SamplingSettings, grammars_from_json, grammars_json

FORMAT = "tokenviz-journal/1"
MAX_JOURNAL_BYTES = 64 << 20  # a journal read back: far past any journey's (a line a token)
KEPT_ORPHANS = 8  # journals of dead processes kept, the newest; older ones go


class _Line(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Header(_Line):
    format: Literal["tokenviz-journal/1"]
    model: Text  # the model's name (ModelInfo.name) and, for a server's, where it runs
    started: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


class Begin(_Line):
    prompt: Text
    chat: Flag = False
    system: Text | None = None


@dataclass(frozen=True)
class Taken:
    """A token of the path, with the settings and interventions in force when it was taken."""

    token: int
    settings: SamplingSettings
    interventions: tuple[Intervention, ...]


@dataclass(frozen=True)
class Journal:
    """A journal read back: the last prompt it started and the path taken from it."""

    path: Path
    model: str
    started: float
    prompt: Begin
    settings: SamplingSettings  # in force at the start
    interventions: tuple[Intervention, ...]
    taken: tuple[Taken, ...] = ()
    final_settings: SamplingSettings = field(default_factory=SamplingSettings)
    final_interventions: tuple[Intervention, ...] = ()


class JournalWriter:
    """Appends a journey's lines to its journal; `discard` removes it (the process ends as it should)."""

    def __init__(self, folder: Path, model: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._lock = FileLock(f"{self.path}.lock")
        self._lock.acquire(timeout=0)
        self._guard = threading.Lock()  # (discard may come from the main thread at exit)
        self._file: Any = self.path.open("a", encoding="utf-8")
        self.write({"format": FORMAT, "model": model, "started": time.time()})

    def write(self, line: dict[str, Any]) -> None:
        """Append `line`. A write that fails (a full disk) ends the journal: one with a gap would give
        back another journey than the one made."""
        with self._guard:
            if self._file is None:
                return
            try:
                self._file.write(json.dumps(line) + "\n")
                self._file.flush()  # (in the operating system's hands: a crash of this process loses nothing)
            except OSError:
                self._end()

    def discard(self) -> None:
        with self._guard:
            if self._file is not None:
                self._end()

    def _end(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        self._file = None
        forget(self.path)
        self._lock.release()


class JournalFollower:
    """Writes to a journal what changed in a journey since the last look: a token taken is a line; a
    path changed anywhere else (a rewind, a branch) is compared whole, only when `moved` says so."""

    def __init__(self, writer: JournalWriter) -> None:
        self.writer = writer
        self._begun: tuple[str, bool, str | None] | None = None
        self._settings: SamplingSettings | None = None
        self._interventions: tuple[Intervention, ...] = ()  # (none, until a line says otherwise)
        self._written: list[int] = []

    def follow(
        self,
        begun: tuple[str, bool, str | None],
        settings: SamplingSettings,
        interventions: tuple[Intervention, ...],
        ids: list[int],
        moved: bool,
        prompt_len: int = 0,
    ) -> None:
        """Write what changed: `ids` is the path, its generated tokens from `prompt_len` on."""
        if begun != self._begun:
            self.writer.write({"start": {"prompt": begun[0], "chat": begun[1], "system": begun[2]}})
            self._begun, self._written, moved = begun, [], True
        if settings != self._settings:
            self.writer.write({"settings": settings.to_json(), "grammars": grammars_json([settings])})
            self._settings = settings
        if interventions != self._interventions:
            self.writer.write({"interventions": [i.to_json() for i in interventions]})
            self._interventions = interventions
        kept, generated = len(self._written), len(ids) - prompt_len
        if moved:
            same = (i for i, token in enumerate(self._written) if i >= generated or ids[prompt_len + i] != token)
            kept = next(same, kept)
            if kept < len(self._written):
                self.writer.write({"cut": kept})
                del self._written[kept:]
        for token in ids[prompt_len + kept :]:
            self.writer.write({"token": token})
            self._written.append(token)


def orphans(folder: Path) -> list[Path]:
    """The journals in `folder` whose process died (their lock is free), newest first; beyond the
    newest KEPT_ORPHANS, removed."""
    found = []
    for path in sorted(folder.glob("*.jsonl"), reverse=True) if folder.is_dir() else ():
        lock = FileLock(f"{path}.lock")
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            continue  # (a live process's)
        lock.release()
        found.append(path)
    for old in found[KEPT_ORPHANS:]:
        forget(old)
    return found[:KEPT_ORPHANS]


def forget(path: Path) -> None:
    """Remove a journal and its lock file."""
    for gone in (path, Path(f"{path}.lock")):
        with contextlib.suppress(OSError):
            gone.unlink()


def journal_model(path: Path) -> str | None:
    """The model a journal is of, from its header line alone (None: not a journal)."""
    try:
        with path.open("rb") as f:
            return Header.model_validate(json.loads(f.readline(64 << 10))).model
    except (OSError, ValueError, ValidationError, RecursionError):
        return None


def read_journal(path: Path) -> Journal:
    """The journal at `path`, checked line by line; one line of TokenvizError where it is not one."""
    try:
        if path.stat().st_size > MAX_JOURNAL_BYTES:
            raise TokenvizError(f"the journal {path.name} is over {MAX_JOURNAL_BYTES >> 20} MB")
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise TokenvizError(f"cannot read the journal {path.name}: {exc.strerror}") from None
    if lines and lines[-1] != b"":
        lines = lines[:-1]  # a line the process's death cut short
    try:
        parsed = [json.loads(line) for line in lines if line.strip()]
        if not parsed or len(parsed) > 4 * MAX_TOKENS:
            raise ValueError("no header")
        header = Header.model_validate(parsed[0])
        return _replayed(path, header, parsed[1:])
    except (ValueError, ValidationError, TokenvizError, TypeError, KeyError, RecursionError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenvizError(f"the journal {path.name} is damaged: {why[:200]}") from None


class Event(BaseModel):
    """One event after the header (one key of these)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    start: Begin | None = None
    settings: dict[str, Any] | None = None
    grammars: dict[str, Any] | None = None
    interventions: Annotated[list[dict[str, Any]], Field(max_length=MAX_INTERVENTIONS)] | None = None
    token: Count | None = None
    cut: Count | None = None


def _replayed(path: Path, header: Header, events: list[Any]) -> Journal:
    """The path the events leave: the last prompt started, and each token taken since (cuts applied)."""
    begun: Begin | None = None
    settings, interventions = SamplingSettings(), cast(tuple[Intervention, ...], ())
    start_settings, start_interventions = settings, interventions
    taken: list[Taken] = []
    for raw in events:
        event = Event.model_validate(raw)
        if event.start is not None:
            begun, taken = event.start, []
            start_settings, start_interventions = settings, interventions
        if event.settings is not None:
            settings = SamplingSettings.from_json(event.settings, grammars_from_json(event.grammars or {}))
            if not taken:
                start_settings = settings
        if event.interventions is not None:
            interventions = tuple(intervention_from_json(d) for d in event.interventions)
            if not taken:
                start_interventions = interventions
        if event.token is not None:
            taken.append(Taken(event.token, settings, interventions))
        if event.cut is not None:
            del taken[event.cut :]
    if begun is None:
        raise ValueError("it holds no prompt")
    return Journal(
        path,
        header.model,
        header.started,
        begun,
        start_settings,
        start_interventions,
        tuple(taken),
        settings,
        interventions,
    )
