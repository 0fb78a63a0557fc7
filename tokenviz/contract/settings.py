"""Sampling settings: plain, validated, and free of torch so the UI can start before the model does.

The field defaults here are the only home of the defaults: the CLI, the worker and the UI read them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import JsonValue, PlainSerializer, PlainValidator, ValidationInfo

from tokenviz.contract.bounds import GRAMMARS, replaced, unicode
from tokenviz.contract.errors import SettingsError, TokenvizError
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.text import safe_text

# Past these, the scaled logits overflow float32 and the distribution is no longer a number.
MIN_TEMPERATURE = 1e-3
PENALTY_RANGE = (1e-2, 1e2)
FIELD_KINDS = {"float": float, "int": int}  # what a typed NAME=VALUE becomes, by the field's annotation
PACES_S = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)  # autoplay's least time between steps; 0: as fast as it runs


@dataclass(frozen=True)
class SamplingSettings:
    """What shapes the next-token distribution. Validated on creation and on every replace()."""

    temperature: float = 0.7  # 0 = greedy (argmax)
    top_k: int = 50  # 0 = off
    top_p: float = 0.9  # 1.0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; over the whole context, as generate() does
    presence_penalty: float = 0.0  # 0 = off; over generated tokens, as OpenAI-style APIs do
    frequency_penalty: float = 0.0  # 0 = off; over generated tokens
    seed: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    grammar: Grammar | None = None  # None = off; the generated text must follow it (tokenviz.decoding.grammar)

    def __post_init__(self) -> None:
        checks = [
            (
                math.isfinite(self.temperature) and (self.temperature == 0 or self.temperature >= MIN_TEMPERATURE),
                f"temperature must be 0 (greedy) or positive, at least {MIN_TEMPERATURE}, got {self.temperature}",
            ),
            (self.top_k >= 0, f"top-k must be 0 (off) or a positive count, got {self.top_k}"),
            (0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p < 1, f"min-p must be in [0, 1), got {self.min_p}"),
            (
                math.isfinite(self.repetition_penalty)
                and PENALTY_RANGE[0] <= self.repetition_penalty <= PENALTY_RANGE[1],
                f"repetition penalty must be positive (1.0 = off), from {PENALTY_RANGE[0]} to {PENALTY_RANGE[1]}, "
                f"got {self.repetition_penalty}",
            ),
            (
                math.isfinite(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
                f"presence penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                math.isfinite(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
                f"frequency penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (self.max_new_tokens >= 1, f"max new tokens must be at least 1, got {self.max_new_tokens}"),
            (0 <= self.seed < 2**63, f"seed must be in [0, 2^63), got {self.seed}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop strings must not be empty, and must be text"),
            (self.grammar is None or isinstance(self.grammar, Grammar), f"not a grammar: {self.grammar!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise SettingsError(message)
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes: object) -> SamplingSettings:
        return replaced(self, changes)

    def with_assignments(self, assignments: Sequence[str], also: str = "") -> SamplingSettings:
        """These settings with `NAME=VALUE` assignments applied (`top-k=10`, `temperature=0`,
        `stop=.`; stop adds a stop string): one clear line for a name or value that is wrong (naming
        `also`, what else the caller takes: see presets.assigned)."""
        fields = {f.name: f for f in dataclasses.fields(self) if f.name != "grammar"}
        changes: dict[str, object] = {}
        for assignment in assignments:
            name, equals, value = assignment.partition("=")
            key = name.strip().replace("-", "_")
            if not equals or key not in fields:
                names = ", ".join(name.replace("_", "-") for name in fields)  # as the dialog and the CLI write them
                raise SettingsError(f"{assignment!r} is not NAME=VALUE with a sampling setting: {names}{also}")
            if key == "stop":
                stops = changes.get("stop", self.stop)
                changes["stop"] = (*(stops if isinstance(stops, tuple) else ()), value)
                continue
            kind = FIELD_KINDS.get(str(fields[key].type), str)  # the field's, not its value's: 0 is a float here
            try:
                changes[key] = kind(value)
            except ValueError:
                raise SettingsError(
                    f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
                ) from None
        return replaced(self, changes)

    @classmethod
    def from_json(cls, d: Mapping[str, object], grammars: Mapping[str, Grammar] | None = None) -> SamplingSettings:
        """The settings as a file keeps them (SavedSettings) read back (validated like any other); their
        grammar, named by its digest, is one of `grammars` (a file lists each grammar once)."""
        grammar = None
        if d.get("grammar") is not None:
            reference = d["grammar"]
            digest = reference.get("digest") if isinstance(reference, dict) else None
            grammar = (grammars or {}).get(digest) if isinstance(digest, str) else None
            if grammar is None:
                raise SettingsError(f"the settings name a grammar that is not given: {reference!r:.60}")
        stop = d.get("stop", ())
        fields = {**d, "stop": tuple(stop) if isinstance(stop, list | tuple) else stop, "grammar": grammar}
        return replaced(cls(), fields)  # each value checked as any setting is


def _saved(settings: SamplingSettings) -> dict[str, JsonValue]:
    """Settings as a file and a document keep them: each field, a grammar by its kind, source and digest,
    not its text (the file lists each grammar once, by digest)."""
    d: dict[str, JsonValue] = {
        f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name not in ("stop", "grammar")
    }
    g = settings.grammar
    d["stop"] = list(settings.stop)
    d["grammar"] = None if g is None else {"kind": g.kind, "source": g.source, "digest": g.digest}
    return d


def grammars_from_json(d: Mapping[str, object]) -> dict[str, Grammar]:
    """A file's grammars (files.record_json.grammars_json), each checked against its digest."""
    grammars = {}
    for digest, g in d.items():
        grammar = Grammar.from_json(g)
        if grammar.digest != digest:
            raise SettingsError(f"grammar {digest!r:.20} does not match its text")
        grammars[digest] = grammar
    return grammars


def _settings_read(d: object, info: ValidationInfo) -> SamplingSettings:
    """Settings as a file keeps them (`_saved`), validated as any other; their grammar one of the
    file's (`GRAMMARS` in the context); their stops made safe to print."""
    if not isinstance(d, dict):
        raise ValueError("the settings are an object of name: value")
    reference = d.get("grammar")
    grammars = (info.context or {}).get(GRAMMARS, {})
    if reference is not None and not (isinstance(reference, dict) and isinstance(reference.get("digest"), str)):
        raise ValueError("a grammar is named by its digest: {kind, source, digest}")
    if reference is not None and reference["digest"] not in grammars:
        raise ValueError(f"the settings name a grammar the file does not hold: {reference['digest']!r:.20}")
    for stop in d["stop"] if isinstance(d.get("stop"), list) else ():
        if isinstance(stop, str):
            unicode(stop)
    try:
        settings = SamplingSettings.from_json(d, grammars)
    except (TokenvizError, TypeError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None
    return settings.replace(stop=tuple(safe_text(stop) for stop in settings.stop))


SavedSettings = Annotated[
    SamplingSettings,
    PlainValidator(_settings_read, json_schema_input_type=dict[str, JsonValue]),
    PlainSerializer(_saved, return_type=dict[str, JsonValue]),
]

DEFAULT_SETTINGS = SamplingSettings()
