"""A symptom of a journey's text, as journey.diagnosis measures it: what it is, its cause, the remedy
the settings offer and the evidence by position. Data only: the snapshot carries it to the app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Symptom:
    symptom: str
    cause: str
    remedy: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def brief(self) -> str:
        """As the status line says it."""
        return f"{self.symptom} ({self.cause})"

    def to_json(self) -> dict[str, Any]:
        return {"symptom": self.symptom, "cause": self.cause, "evidence": self.evidence, "remedy": self.remedy}
