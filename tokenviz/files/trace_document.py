"""The trace document: a journey as one JSON-ready dict (what `tokenviz trace --json` prints and
what a saved journey file starts with)."""

from __future__ import annotations

from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.snapshot import Snapshot


def document_of_snapshot(snapshot: Snapshot) -> dict[str, Any]:
    """The trace document: model, prompt, every committed step, the text."""
    if snapshot.info is None:
        raise TokenvizError("no journey yet: the model has not loaded")
    committed = len(snapshot.chips) - snapshot.prompt_len
    return {
        "model": snapshot.info.to_json(),
        "settings": snapshot.settings.to_json(),
        "prompt": [{"id": c.id, "text": c.text} for c in snapshot.chips[: snapshot.prompt_len]],
        "steps": [r.to_json() for r in snapshot.records[:committed]],
        "prefill_ms": snapshot.records[0].forward_ms if snapshot.records else None,
        "stop_reason": snapshot.stop_reason,
        "text": snapshot.text,
        "full_text": snapshot.full_text,
    }
