"""What the user is looking at: a Snapshot plus the choices of layer, head and cursor."""

from __future__ import annotations

from dataclasses import dataclass

from tokenviz.contract.attention import Head
from tokenviz.contract.records import ModelInfo, PromptPrediction, StepRecord
from tokenviz.contract.snapshot import Snapshot


@dataclass(frozen=True)
class Selection:
    """A journey with its model loaded (`info` is the snapshot's, never None) and what is chosen in it."""

    snapshot: Snapshot
    info: ModelInfo
    layer: int  # 0-based
    head: Head  # an index, "mean" or "max"
    cursor: int  # the selected token position

    @property
    def positions(self) -> int:
        """Positions that went through the model (and so have an attention row)."""
        s = self.snapshot
        return s.prompt_len + len(s.records) - 1 if s.records else 0

    @property
    def record(self) -> StepRecord | None:
        """The prediction made at the cursor's position, if the model computed one there."""
        index = self.cursor - self.snapshot.prompt_len + 1
        records = self.snapshot.records
        return records[index] if 0 <= index < len(records) else None

    @property
    def prompt_prediction(self) -> PromptPrediction | None:
        """Inside the prompt (before its last token): what the prefill predicted after the cursor's token."""
        records = self.snapshot.records
        predictions = records[0].prompt_predictions if records else ()
        return predictions[self.cursor] if 0 <= self.cursor < len(predictions) else None

    @property
    def is_pending(self) -> bool:
        return self.record is not None and self.record is self.snapshot.pending

    @property
    def following_id(self) -> int | None:
        """The token that followed the cursor's (or is pending after it)."""
        s = self.snapshot
        if self.cursor + 1 < len(s.chips):
            return s.chips[self.cursor + 1].id
        return s.pending.decision.chosen_id if s.pending else None
