"""Saved journeys: the trace document plus every record the panes need, so a journey can be
replayed read-only without the model (and re-run with it: tokenviz.journey.reproduce).

The file is JSON: the trace schema (model, prompt, steps, text), plus "replay": the full step
records, the token chips and the model facts. Attention rows (base64 float16, every layer) are kept
for the newest positions within ATTENTION_BYTES: record 0 holds the newest rows of the prompt, each
later record the row of the token it fed.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokenviz.contract.attention import SavedAttention
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import (
    Candidate,
    Decision,
    ModelInfo,
    PinnedToken,
    PromptPrediction,
    Routing,
    Stage,
    StepRecord,
    TokenChip,
    Unsteered,
)
from tokenviz.contract.results import Analyses, Attribution, BranchSummary, LogitDifference
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.files import journey_schema as schema
from tokenviz.files.atomic import write_file
from tokenviz.files.documents import trace_document
from tokenviz.files.journey_schema import parse_journey

FORMAT = "tokenviz-journey/1"
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


def _array(a: np.ndarray) -> dict[str, Any]:
    return {"shape": list(a.shape), "float16": base64.b64encode(a.astype(np.float16).tobytes()).decode()}


def _record(r: StepRecord, attention: np.ndarray | None, sets: list[tuple[Intervention, ...]]) -> dict[str, Any]:
    d = r.decision
    return {
        "index": r.index,
        "position": r.position,
        "input_ids": list(r.input_ids),
        "input_texts": list(r.input_texts),
        "top": [[c.id, c.text, c.logit, c.prob] for c in r.top],
        "entropy": r.entropy,
        "attention": None if attention is None else _array(attention),
        "forward_ms": r.forward_ms,
        "place_ms": [list(p) for p in r.place_ms],
        "kv_len": r.kv_len,
        "kv_bytes": r.kv_bytes,
        "decision": {
            "mode": d.mode,
            "settings": d.settings.to_json(),
            "watch": [list(w) for w in d.watch],
            "raw_probs": list(d.raw_probs),
            "stages": [[st.name, st.detail, st.kept, st.mass, list(st.probs)] for st in d.stages],
            "u": d.u,
            "band": list(d.band) if d.band else None,
            "chosen_id": d.chosen_id,
            "chosen_text": d.chosen_text,
            "chosen_prob": d.chosen_prob,
            "chosen_rank": d.chosen_rank,
            "raw_rank": d.raw_rank,
            "raw_prob": d.raw_prob,
            "ms": d.ms,
            "pinned": [[p.id, p.text, p.prob, p.final_prob, p.rank] for p in d.pinned],
        },
        "prompt_predictions": [
            [
                p.position,
                [[c.id, c.text, c.logit, c.prob] for c in p.top],
                p.entropy,
                p.next_id,
                p.next_text,
                p.next_prob,
                p.next_rank,
            ]
            for p in r.prompt_predictions
        ],
        "routing": _routing(r.routing),
        "interventions": _set_index(sets, r.interventions),
        "unsteered": {
            "top": [[c.id, c.text, c.logit, c.prob] for c in r.unsteered.top],
            "kl": r.unsteered.kl,
            "ms": r.unsteered.ms,
            "kl_floor": r.unsteered.kl_floor,
        }
        if r.unsteered
        else None,
    }


def _set_index(sets: list[tuple[Intervention, ...]], interventions: tuple[Intervention, ...]) -> int | None:
    """The index of `interventions` in `sets` (each set a file holds once), added where new."""
    if not interventions:
        return None
    if interventions not in sets:
        sets.append(interventions)
    return sets.index(interventions)


def _routing(routing: Routing | None) -> dict[str, Any] | None:
    if routing is None:
        return None
    names = ("experts", "weights", "entropy", "shared")
    encoded = {name: base64.b64encode(getattr(routing, name)).decode() for name in names}
    return {"layers": list(routing.layers), "k": routing.k, "positions": routing.positions, **encoded}


def _unrecord(
    r: schema.Record, grammars: Mapping[str, Grammar], sets: Sequence[tuple[Intervention, ...]]
) -> StepRecord:
    d = r.decision
    decision = Decision(
        mode=d.mode,
        settings=d.settings.settings(grammars),
        watch=tuple(d.watch),
        raw_probs=tuple(d.raw_probs),
        stages=tuple(Stage(name=n, detail=t, kept=k, mass=m, probs=tuple(p)) for n, t, k, m, p in d.stages),
        u=d.u,
        band=d.band,
        chosen_id=d.chosen_id,
        chosen_text=d.chosen_text,
        chosen_prob=d.chosen_prob,
        chosen_rank=d.chosen_rank,
        raw_rank=d.raw_rank,
        raw_prob=d.raw_prob,
        ms=d.ms,
        pinned=tuple(PinnedToken(*p) for p in d.pinned),
    )
    return StepRecord(
        index=r.index,
        position=r.position,
        input_ids=tuple(r.input_ids),
        input_texts=tuple(r.input_texts),
        top=tuple(Candidate(id=i, text=t, logit=lg, prob=p) for i, t, lg, p in r.top),
        entropy=r.entropy,
        decision=decision,
        forward_ms=r.forward_ms,
        place_ms=tuple((place, ms) for place, ms in r.place_ms),
        kv_len=r.kv_len,
        kv_bytes=r.kv_bytes,
        prompt_predictions=tuple(
            PromptPrediction(
                position=position,
                top=tuple(Candidate(id=i, text=t, logit=lg, prob=p) for i, t, lg, p in top),
                entropy=entropy,
                next_id=next_id,
                next_text=next_text,
                next_prob=next_prob,
                next_rank=next_rank,
            )
            for position, top, entropy, next_id, next_text, next_prob, next_rank in r.prompt_predictions
        ),
        routing=r.routing.routing() if r.routing is not None else None,
        interventions=sets[r.interventions] if r.interventions is not None else (),
        unsteered=Unsteered(
            tuple(Candidate(*c) for c in r.unsteered.top), r.unsteered.kl, r.unsteered.ms, r.unsteered.kl_floor
        )
        if r.unsteered
        else None,
    )


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
    is the trace document when there is one."""
    if snapshot.info is None:
        raise TokenvizError("nothing to save: the model has not loaded")
    doc = dict(document or trace_document(snapshot))
    doc["format"] = FORMAT
    sets: list[tuple[Intervention, ...]] = []  # each set of interventions the records name, once
    doc["replay"] = {
        "info": snapshot.info.to_json(),
        "chips": [[c.id, c.text, c.is_prompt, c.is_special, c.is_template] for c in snapshot.chips],
        "chat": snapshot.chat,
        "system": snapshot.system,
        "prompt_len": snapshot.prompt_len,
        "prompt_text": snapshot.prompt,
        "records": [
            _record(r, a, sets) for r, a in zip(snapshot.records, _blocks(snapshot, attention or SavedAttention()))
        ],
        "stop_reason": snapshot.stop_reason,
        "branches": [dataclasses.asdict(b) for b in snapshot.branches],
        "pinned": [list(p) for p in snapshot.pinned],
        "attributions": [dataclasses.asdict(a) for a in analyses.attributions],
        "logit_differences": [dataclasses.asdict(d) for d in analyses.logit_differences],
    }
    doc["replay"]["intervention_sets"] = [[i.to_json() for i in interventions] for interventions in sets]
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


def read_journey(path: str | Path) -> dict[str, Any]:
    """The journey file at `path` as its JSON, read within the limits and validated (see journey_schema)."""
    doc = _read_json(path)
    parse_journey(doc)
    return doc


def open_journey(path: str | Path) -> schema.Journey:
    """The journey file at `path`, read within the limits and validated once."""
    return parse_journey(_read_json(path))


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
    if isinstance(version, str) and version.startswith("tokenviz-journey/") and version != FORMAT:
        raise TokenvizError(f"{safe_text(str(path))} has format {safe_text(version)}; this tokenviz reads {FORMAT}")
    if version != FORMAT:
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
        reason = str(exc).split(";")[0]  # (Python's advice on its own settings is not the user's)
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


def _saved_attention(r: schema.Replay) -> SavedAttention:
    n, rows = r.prompt_len, {}
    for i, record in enumerate(r.records):
        if record.attention is None:
            continue
        block = record.attention.array()
        first = n - block.shape[2] if i == 0 else n - 1 + i
        for k in range(block.shape[2]):
            rows[first + k] = block[:, :, k]
    return SavedAttention(rows)


def snapshot_from_journey(doc: dict[str, Any] | schema.Journey) -> Snapshot:
    return recording_of(doc).snapshot


def recording_of(doc: dict[str, Any] | schema.Journey) -> Recording:
    """The journey as the app can show it without a model (every string made safe to print)."""
    journey = doc if isinstance(doc, schema.Journey) else parse_journey(doc)
    r, grammars = journey.replay, journey.grammar_table
    records = tuple(_unrecord(x, grammars, r.intervention_table) for x in r.records)
    snapshot = Snapshot(
        seq=1,
        state="stopped" if r.stop_reason else "ready",
        info=ModelInfo(**{**r.info.model_dump(), "capabilities": tuple(r.info.capabilities)}),
        settings=journey.settings.settings(grammars),
        prompt=r.prompt_text,
        chips=(chips := tuple(TokenChip(*chip) for chip in r.chips)),
        full_text="".join(chip.text for chip in chips),  # the pieces, each decoded alone
        chat=r.chat,
        system=r.system,
        prompt_len=r.prompt_len,
        records=records,
        stop_reason=r.stop_reason,
        message="a recorded journey: read-only",
        branches=tuple(BranchSummary(**b.model_dump()) for b in r.branches),
        pinned=tuple(tuple(p) for p in r.pinned),  # type: ignore[misc]
        interventions=tuple((i, True) for i in records[-1].interventions),  # those in force at the end
    )
    analyses = Analyses(
        tuple(Attribution(**{**a.model_dump(), "scores": tuple(a.scores)}) for a in r.attributions),
        tuple(
            LogitDifference(**{**d.model_dump(), "attention": tuple(d.attention), "mlp": tuple(d.mlp)})
            for d in r.logit_differences
        ),
    )
    return Recording(snapshot, _saved_attention(r), analyses)
