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
import io
import itertools
import json
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from filelock import FileLock, Timeout
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from tokenviz.contract.bounds import MAX_TOKENS, Count, Flag, Text, first_error, unicode
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import MAX_INTERVENTIONS, Intervention, intervention_from_json
from tokenviz.contract.settings import SamplingSettings, grammars_from_json
from tokenviz.contract.text import safe_text
from tokenviz.files.record_json import grammars_json, intervention_json, settings_json
from tokenviz.system.reading import OPEN_FLAGS, read_file

FORMAT = "tokenviz-journal/1"
MAX_JOURNAL_BYTES = 64 << 20  # a journal read back: far past any journey's (a line a token)
MAX_LINES = 4 * MAX_TOKENS  # lines of a journal read back (a token, a cut, a setting or intervention each)
MAX_LINE_BYTES = 16 << 20  # one line (the prompt's, JSON-escaped, is the longest)
MAX_PROMPT_CHARS = 8 * MAX_TOKENS  # a prompt of the longest journey's tokens, 8 characters each
LATEST = 253402300799.0  # the last second of the year 9999: a start time a clock can say
KEPT_ORPHANS = 8  # journals of dead processes kept, the newest; older ones go


class _Line(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Named(BaseModel):
    """A journal's header as far as saying whose it is (the rest is checked where it is read whole)."""

    format: Literal["tokenviz-journal/1"]
    model: Text


class Header(_Line):
    format: Literal["tokenviz-journal/1"]
    model: Text  # the model as the journey ran it: its name, runtime and dtype (and a server's address)
    started: Annotated[float, Field(strict=True, ge=0, le=LATEST, allow_inf_nan=False)]


# A prompt as the user typed it, control characters and all (Text would show them as <0x..>, and the
# prompt taken again would then be another): bounded, and never printed from here.
Typed = Annotated[str, Field(strict=True, max_length=MAX_PROMPT_CHARS), AfterValidator(unicode)]


class Begin(_Line):
    prompt: Typed
    chat: Flag = False
    system: Typed | None = None
    ids: Annotated[list[Count], Field(max_length=MAX_TOKENS)] | None = None  # the prompt's tokens then


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
    """Appends a journey's lines to its journal; `discard` removes it (the process ends as it should),
    `keep` leaves it (the process ends without the user quitting)."""

    def __init__(self, folder: Path, model: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._lock = FileLock(f"{self.path}.lock", thread_local=False)  # taken in the worker, let go at exit
        self._lock.acquire(timeout=0)
        self._guard = threading.Lock()  # discard may come from the main thread at exit
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
                self._file.flush()  # in the operating system's hands: a crash of this process loses nothing
            except OSError:
                self._end()

    def discard(self) -> None:
        with self._guard:
            if self._file is not None:
                self._end()

    def keep(self) -> None:
        """Stop writing and leave the journal where it is (the process ends without the user quitting): the
        next start on its model offers it, as it would after a crash."""
        with self._guard:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
                self._lock.release()

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
        self._interventions: tuple[Intervention, ...] = ()  # none, until a line says otherwise
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
            prompt = {"prompt": begun[0], "chat": begun[1], "system": begun[2], "ids": ids[:prompt_len]}
            self.writer.write({"start": prompt})
            self._begun, self._written, moved = begun, [], True
        if settings != self._settings:
            self.writer.write({"settings": settings_json(settings), "grammars": grammars_json([settings])})
            self._settings = settings
        if interventions != self._interventions:
            self.writer.write({"interventions": [intervention_json(i) for i in interventions]})
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


def _regular(path: Path) -> bool:
    """Whether `path` is a regular file (not a FIFO, which opening would wait on forever, nor a device)."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def orphans(folder: Path) -> list[Path]:
    """The journals in `folder` whose process died (their lock is free), newest first; beyond the
    newest KEPT_ORPHANS, removed. Only regular files count: anything else there is left alone."""
    found = []
    for path in sorted(filter(_regular, folder.glob("*.jsonl")), reverse=True) if folder.is_dir() else ():
        lock = FileLock(f"{path}.lock")
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            continue  # a live process's
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
        fd = os.open(path, OPEN_FLAGS)  # without blocking: a FIFO put there never holds the start
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return Named.model_validate(json.loads(f.readline(64 << 10))).model
    except (OSError, ValueError, ValidationError, RecursionError):
        return None


def _lines(data: bytes) -> Iterator[Any]:
    """Each whole line of a journal, parsed, one at a time (a journal of millions of lines is never all in
    memory at once); one that the process's death cut short (no newline) is left out."""
    with io.BytesIO(data) as lines:
        for count in itertools.count(1):
            line = lines.readline(MAX_LINE_BYTES + 1)
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE_BYTES:
                    raise ValueError(f"line {count:,} is over {MAX_LINE_BYTES >> 20} MB")
                return
            if count > MAX_LINES + 1:
                raise ValueError(f"it holds over {MAX_LINES:,} lines (a journey's longest holds fewer)")
            if line.strip():
                yield json.loads(line)


def read_journal(path: Path) -> Journal:
    """The journal at `path`, checked line by line; one line of TokenvizError where it is not one."""
    data = read_file(path, MAX_JOURNAL_BYTES, f"the journal {path.name}", TokenvizError)
    try:
        events = _lines(data)
        first = next(events, None)
        if first is None:
            raise ValueError("it has no header")
        return _path_of_events(path, Header.model_validate(first), events)
    except ValidationError as exc:
        raise TokenvizError(f"the journal {path.name} is damaged {first_error(exc)[:200]}") from None
    except (ValueError, TokenvizError, TypeError, KeyError, RecursionError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TokenvizError(f"the journal {path.name} is damaged: {safe_text(why[:200])}") from None


class Event(BaseModel):
    """One event after the header (one key of these)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    start: Begin | None = None
    settings: dict[str, Any] | None = None
    grammars: dict[str, Any] | None = None
    interventions: Annotated[list[dict[str, Any]], Field(max_length=MAX_INTERVENTIONS)] | None = None
    token: Count | None = None
    cut: Count | None = None


def _path_of_events(path: Path, header: Header, events: Iterable[Any]) -> Journal:
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
