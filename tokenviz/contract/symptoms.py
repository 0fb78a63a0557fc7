"""A symptom of a journey's text, as journey.diagnosis measures it: what it is, its cause, the remedy
the settings offer and the evidence by position. Data only: the snapshot carries it to the app."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DrawnAt:
    """A step the evidence points to: the position its token took, its raw rank and probability."""

    position: int
    rank: int
    raw_p: float


Fact = int | float | str | tuple[int, ...] | tuple[DrawnAt, ...]  # one piece of evidence
Evidence = int | float | str | list[int | dict[str, int | float]]  # a fact as JSON gives it


@dataclass(frozen=True)
class Symptom:
    symptom: str
    cause: str
    remedy: str
    facts: tuple[tuple[str, Fact], ...] = ()  # the evidence, by name, in order

    @property
    def brief(self) -> str:
        """As the status line says it."""
        return f"{self.symptom} ({self.cause})"

    @property
    def evidence(self) -> dict[str, Evidence]:
        """The evidence as JSON gives it: lists for the tuples, a step as its fields."""
        return {
            name: [asdict(v) if isinstance(v, DrawnAt) else v for v in value] if isinstance(value, tuple) else value
            for name, value in self.facts
        }
