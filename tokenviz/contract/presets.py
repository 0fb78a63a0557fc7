"""Task presets: the sampling settings the source texts give by task, as one named change.

Each sets every stage that shapes the distribution (temperature, top-k, top-p, min-p and the three
penalties), so the journey runs exactly the configuration the texts give: theirs name no top-k or
min-p (an OpenAI-style API has none), so a preset turns both off. The seed, the new-token limit, the
stop strings and a grammar are the journey's, untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.settings import SamplingSettings

OFF = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


@dataclass(frozen=True)
class Preset:
    name: str
    task: str  # what it is for, as the texts say
    fields: dict[str, float]  # every SamplingSettings field it sets

    @property
    def summary(self) -> str:
        """Its settings in the sampling pane's words."""
        s = self.fields
        penalty = f", frequency penalty {s['frequency_penalty']:g}" if s["frequency_penalty"] else ""
        return f"temperature {s['temperature']:g}, top-p {s['top_p']:g}{penalty}, top-k and min-p off"


PRESETS = (
    Preset("factual", "factual answers and code", {**OFF, "temperature": 0.2, "top_p": 0.9}),
    Preset("balanced", "conversation", {**OFF, "temperature": 0.7, "top_p": 0.9}),
    Preset("creative", "creative writing", {**OFF, "temperature": 1.0, "top_p": 0.95, "frequency_penalty": 0.3}),
)
BY_NAME = {p.name: p for p in PRESETS}


def preset_named(name: str) -> Preset:
    """The preset `name` names; one line listing them where it names none."""
    found = BY_NAME.get(name.strip().lower())
    if found is None:
        raise SettingsError(f"--preset takes {', '.join(BY_NAME)}; got {name!r}")
    return found


PRESET_NAME = "preset"  # preset=NAME among NAME=VALUE assignments


def assigned(settings: SamplingSettings, assignments: Sequence[str]) -> SamplingSettings:
    """`settings` with NAME=VALUE assignments applied (SamplingSettings.changed), where `preset=NAME`
    applies a preset's settings first: a setting named beside it wins, as beside --preset."""
    presets = [a for a in assignments if a.partition("=")[0].strip().lower() == PRESET_NAME]
    for assignment in presets:
        name = assignment.partition("=")[2]
        preset = BY_NAME.get(name.strip().lower())
        if preset is None:
            raise SettingsError(f"preset= takes {', '.join(BY_NAME)}; got {name!r}")
        settings = with_preset(settings, preset)
    also = f"; or {PRESET_NAME}={'|'.join(BY_NAME)}"
    return settings.with_assignments([a for a in assignments if a not in presets], also=also)


def with_preset(settings: SamplingSettings, preset: Preset) -> SamplingSettings:
    return settings.replace(**preset.fields)


def preset_in_force(settings: SamplingSettings) -> Preset | None:
    """The preset whose every setting these are, or None."""
    return next((p for p in PRESETS if all(getattr(settings, k) == v for k, v in p.fields.items())), None)
