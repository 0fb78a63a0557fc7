"""Saved journeys: every record the panes need, so a journey can be replayed read-only without the
model (and re-run with it: tokenviz.journey.reproduce), under the trace document's head.

The file is JSON: the trace document but its steps (model, settings, prompt, text), "replay" (the step
records, the token chips and the model facts), and "step_views", what the trace's views added to each
step (its lens, attention row, routing, attribution). Each step is held once, in its record: the trace
document's steps are made from the records again (`trace_document_of`), as `replay FILE --json` prints
them. Attention rows (base64 float16, every layer) are kept for the newest positions within
ATTENTION_BYTES: record 0 holds the newest rows of the prompt, each later record the row of the token it
fed.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokenviz.contract.attention import SavedAttention
from tokenviz.contract.bounds import INTERVENTION_SETS
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.results import Analyses
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.files.atomic import write_file
from tokenviz.files.documents import TRACE_STEP_KEYS, trace_document
from tokenviz.files.journey_schema import EARLIER_FORMATS, FORMAT, Journey, Replay, SavedStep, as_current, parse_journey
from tokenviz.files.record_json import intervention_json

MAX_FILE_BYTES = 1 << 30  # 1 GiB
READ_MEMORY = 1 << 30  # the most memory reading a journey may take (its text, and what it parses into)
BYTES_PER_VALUE = 48  # a parsed number, string or container and its place in a list (34 measured)
ATTENTION_BYTES = 32 << 20  # float16 attention rows a saved journey keeps, the newest first


def rows_to_save(positions: int, layers: int, heads: int, budget: int = ATTENTION_BYTES) -> range:
    """The newest positions (of `positions` through the model) whose rows fit in `budget` bytes."""
    start, total = positions, 0
    while start > 0 and total + layers * heads * start * 2 <= budget:
        start -= 1
        total += layers * heads * (start + 1) * 2
    return range(start, positions)


def _blocks(snapshot: Snapshot, attention: SavedAttention) -> list[np.ndarray | None]:
    """Each record's attention in the file: the prompt's kept rows for record 0, then one row each."""
    n, rows = snapshot.prompt_len, attention.rows

    def padded(position: int, keys: int) -> np.ndarray:  # the future's weights are zero
        row = rows[position][..., :keys]
        return np.pad(row, ((0, 0), (0, 0), (0, keys - row.shape[-1])))

    prompt = [padded(p, n) for p in range(n) if p in rows]
    blocks: list[np.ndarray | None] = [np.stack(prompt, 2) if prompt else None]
    for i in range(1, len(snapshot.records)):
        blocks.append(padded(n - 1 + i, n + i)[:, :, None] if n - 1 + i in rows else None)
    return blocks


def journey_file(
    snapshot: Snapshot,
    attention: SavedAttention | None = None,
    analyses: Analyses = Analyses(),
    document: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The saveable journey of `snapshot` with the attention rows and analyses kept; `document`
    is the trace document when there is one (what its views added to each step is kept)."""
    if snapshot.info is None:
        raise TokenvizError("nothing to save: the model has not loaded")
    whole = document or trace_document(snapshot)
    doc = {key: value for key, value in whole.items() if key != "steps"}
    doc["format"] = FORMAT
    views = [{key: value for key, value in step.items() if key not in TRACE_STEP_KEYS} for step in whole["steps"]]
    if any(views):
        doc["step_views"] = views
    blocks = _blocks(snapshot, attention or SavedAttention())
    replay = Replay.model_construct(
        info=snapshot.info,
        chips=snapshot.chips,
        chat=snapshot.chat,
        system=snapshot.system,
        prompt_len=snapshot.prompt_len,
        prompt_text=snapshot.prompt,
        records=tuple(SavedStep.of(record, block) for record, block in zip(snapshot.records, blocks)),
        stop_reason=snapshot.stop_reason,
        branches=snapshot.branches,
        pinned=snapshot.pinned,
        attributions=analyses.attributions,
        logit_differences=analyses.logit_differences,
    )
    sets: list[tuple[Intervention, ...]] = []  # each set of interventions the records name, once
    doc["replay"] = replay.model_dump(mode="json", context={INTERVENTION_SETS: sets})
    doc["replay"]["intervention_sets"] = [[intervention_json(i) for i in interventions] for interventions in sets]
    return doc


def save_journey(
    path: str | Path,
    snapshot: Snapshot,
    attention: SavedAttention | None = None,
    analyses: Analyses = Analyses(),
    document: dict[str, Any] | None = None,
    replace: bool = False,
) -> Path:
    """Write the journey atomically; an existing file is replaced only with `replace`."""
    return write_file(path, json.dumps(journey_file(snapshot, attention, analyses, document)), replace=replace)


def load_journey(path: str | Path) -> tuple[dict[str, Any], Journey]:
    """The journey file at `path` as its JSON in this format (an earlier one's made so: as_current) and as
    the journey it holds: read within the limits and validated (see journey_schema), once."""
    doc = dict(as_current(_read_json(path)))
    return doc, parse_journey(doc)


def read_journey(path: str | Path) -> dict[str, Any]:
    """The journey file at `path` as its JSON in this format, read and validated (load_journey)."""
    return load_journey(path)[0]


def open_journey(path: str | Path) -> Journey:
    """The journey file at `path`, read within the limits and validated once."""
    return load_journey(path)[1]


def trace_document_of(doc: dict[str, Any], journey: Journey) -> dict[str, Any]:
    """The trace document a journey file (`doc`, its JSON as load_journey gives it, and `journey`, what it
    holds) was saved from: its head as the file holds it, its steps made from its records again with what the
    trace's views added to each (`step_views`)."""
    made = trace_document(recording_of(journey).snapshot)
    views = [_made_safe(view) for view in journey.step_views]  # the file's words: printed, never raw
    steps = [step | (views[i] if i < len(views) else {}) for i, step in enumerate(made["steps"])]
    head = {key: _made_safe(value) for key, value in doc.items() if key not in ("format", "replay", "step_views")}
    return {key: steps if key == "steps" else head.get(key, value) for key, value in made.items()} | head


def _made_safe(value: Any) -> Any:
    """`value` (a file's JSON) with every text in it, keys too, safe to print (safe_text)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(str(key)): _made_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_made_safe(item) for item in value]
    return value


def _read_json(path: str | Path) -> dict[str, Any]:
    path = Path(path).expanduser()
    try:
        status = path.stat()
    except FileNotFoundError:
        raise TokenvizError(f"no such file: {safe_text(str(path))}") from None
    except OSError as exc:
        raise TokenvizError(f"cannot read {safe_text(str(path))}: {exc.strerror}") from None
    if not stat.S_ISREG(status.st_mode):
        raise TokenvizError(f"{safe_text(str(path))} is not a regular file")
    if status.st_size > MAX_FILE_BYTES:
        raise TokenvizError(
            f"{safe_text(str(path))} is {status.st_size / 2**20:.0f} MB; tokenviz reads journeys of up to "
            f"{MAX_FILE_BYTES // 2**20} MB"
        )
    doc = _parse(path, status.st_size)
    if not isinstance(doc, dict):
        raise TokenvizError(
            f"{safe_text(str(path))} is not a tokenviz journey (save one with x in the app or trace --save)"
        )
    version = doc.get("format")
    readable = (FORMAT, *EARLIER_FORMATS)
    if isinstance(version, str) and version.startswith("tokenviz-journey/") and version not in readable:
        raise TokenvizError(
            f"{safe_text(str(path))} has format {safe_text(version)}; this tokenviz reads {', '.join(readable)}"
        )
    if version not in readable:
        raise TokenvizError(
            f"{safe_text(str(path))} is not a tokenviz journey (save one with x in the app or trace --save)"
        )
    return doc


def _parse(path: Path, size: int) -> Any:
    """The file's JSON, parsed only where its estimated cost fits READ_MEMORY."""
    try:
        needed = _reading_cost(path, size)
        if needed > READ_MEMORY:
            raise TokenvizError(
                f"{safe_text(str(path))} would take about {needed / 2**20:.0f} MB to read (it holds about "
                f"{(needed - 3 * size) // BYTES_PER_VALUE:,} values); tokenviz reads journeys within "
                f"{READ_MEMORY // 2**20} MB"
            )
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise TokenvizError(f"cannot read {safe_text(str(path))}: {exc.strerror}") from None
    except (UnicodeDecodeError, RecursionError):
        raise TokenvizError(f"{safe_text(str(path))} is not JSON text") from None
    except json.JSONDecodeError as exc:
        raise TokenvizError(f"{safe_text(str(path))} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # what the reader refuses beyond JSON's grammar: a 5,000-digit integer, say
        reason = str(exc).split(";")[0]  # Python's advice on its own settings is not the user's
        raise TokenvizError(f"{safe_text(str(path))} cannot be read: {safe_text(reason)}") from None
    return doc


def _reading_cost(path: Path, size: int) -> int:
    """What parsing the file would take, from one pass over it in chunks (so nothing large is built
    to find out): its bytes and their text, and every value it holds (counted by its separators)."""
    values = 1
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            values += chunk.count(b",") + chunk.count(b"[") + chunk.count(b"{")
    return 3 * size + BYTES_PER_VALUE * values


class Recording(NamedTuple):
    """A saved journey as the app replays it: the Snapshot, the attention rows and analyses kept."""

    snapshot: Snapshot
    attention: SavedAttention
    analyses: Analyses = Analyses()


def _saved_attention(r: Replay) -> SavedAttention:
    n, rows = r.prompt_len, {}
    for i, record in enumerate(r.records):
        if record.attention is None:
            continue
        block = record.attention.array()
        first = n - block.shape[2] if i == 0 else n - 1 + i
        for k in range(block.shape[2]):
            rows[first + k] = block[:, :, k]
    return SavedAttention(rows)


def snapshot_from_journey(doc: dict[str, Any] | Journey) -> Snapshot:
    return recording_of(doc).snapshot


def recording_of(doc: dict[str, Any] | Journey) -> Recording:
    """The journey as the app can show it without a model (every string made safe to print)."""
    journey = doc if isinstance(doc, Journey) else parse_journey(doc)
    r = journey.replay
    records = tuple(saved.record for saved in r.records)
    snapshot = Snapshot(
        seq=1,
        state="stopped" if r.stop_reason else "ready",
        info=r.info,
        settings=journey.settings,
        prompt=r.prompt_text,
        chips=r.chips,
        full_text="".join(chip.text for chip in r.chips),  # the pieces, each decoded alone
        chat=r.chat,
        system=r.system,
        prompt_len=r.prompt_len,
        records=records,
        stop_reason=r.stop_reason,
        message="a recorded journey: read-only",
        branches=r.branches,
        pinned=r.pinned,
        interventions=tuple((i, True) for i in records[-1].interventions),  # those in force at the end
    )
    return Recording(snapshot, _saved_attention(r), Analyses(r.attributions, r.logit_differences))
