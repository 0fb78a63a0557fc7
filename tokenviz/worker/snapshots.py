"""A session's journey as a Snapshot, and the attention rows a journey file keeps beside it (the engine
thread, the headless trace and the tests use them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tokenviz.contract.attention import SavedAttention
from tokenviz.contract.engine import Capability
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.symptoms import Symptom
from tokenviz.files.journey_file import rows_to_save
from tokenviz.journey import memory_policy
from tokenviz.journey.chips import chips_of

if TYPE_CHECKING:
    from tokenviz.journey.session import Session


def snapshot_of(session: Session, seq: int = 1, found: list[Symptom] | None = None, **fields: Any) -> Snapshot:
    """The journey of `session` as a Snapshot; `fields` set or override the others; `found`: its
    symptoms, where the caller has them (else asked here once it has stopped)."""
    s = session
    if found is None and s.stop_reason:
        found = symptoms(s)
    state = "stopped" if s.stop_reason else "ready"
    return Snapshot(
        seq=seq,
        state=fields.pop("state", state),
        info=s.engine.info,
        settings=s.settings,
        prompt=s.prompt,
        chat=s.chat,
        system=s.system,
        chips=chips_of(s),
        prompt_len=len(s.prompt_ids),
        records=tuple(s.records),
        stop_reason=s.stop_reason,
        cache_event=s.last_cache_event,
        text=s.generated_text,
        full_text=s.text,
        branches=tuple(s.branch_summaries()) if len(s.branches) else (),
        pinned=tuple((t, s.engine.piece(t)) for t in s.pinned),
        why=tuple(found or ()),
        lens_ms=s.analyses.lens_ms,
        lens_rows=chosen_lens_rows(s),
        **fields,
    )


def chosen_lens_rows(session: Session) -> tuple[int, ...] | None:
    """The lens rows chosen (--lens-layers), where each is one the model has (else the lens view says why
    when it asks); None: every layer's."""
    try:
        return session.analyses.lens_rows()
    except TokenvizError:
        return None


def symptoms(session: Session) -> list[Symptom]:
    """What journey.diagnosis finds in the session's text (asked once it has stopped: the text is whole)."""
    from tokenviz.journey.diagnosis import diagnose

    s = session
    return diagnose(s.records, s.ids, len(s.prompt_ids), s.generated_text, s.stop_reason, s.settings, s.engine.piece)


def saved_attention_of(session: Session, positions: Sequence[int] | None = None) -> SavedAttention:
    """Every layer's rows at the newest positions, as many as a journey file keeps (float16), or at
    `positions` (a saved file's, made again by replay --verify); none where the engine does not give
    attention (a served model without the plugin)."""
    info, rows = session.engine.info, {}
    if Capability.ATTENTION.value not in info.capabilities:
        return SavedAttention({})
    if positions is None:
        keep = rows_to_save(session.engine.kv_len, info.layers, info.heads)
    else:
        keep = range(min(positions), max(positions) + 1) if positions else range(0)
    step = memory_policy.PREFILL_CHUNK // 4
    for begin in range(keep.start, keep.stop, step):
        chunk = range(begin, min(begin + step, keep.stop))
        weights = session.attention(chunk, range(info.layers)).astype(np.float16)
        rows.update({q: weights[:, :, i, : q + 1] for i, q in enumerate(chunk)})
    wanted = set(keep if positions is None else positions)
    return SavedAttention({q: row for q, row in rows.items() if q in wanted})
