"""What the settings keys do: nudge one sampling setting a notch up or down.

Kept apart from the UI so the engine thread applies nudges in order (a burst of T presses adds up)
and tests can check the ladder without a terminal.
"""

from __future__ import annotations

from tokenviz.contract.presets import BY_NAME, with_preset
from tokenviz.contract.settings import DEFAULT_SETTINGS, SamplingSettings

TOP_K_LADDER = [0, 1, 2, 3, 5, 10, 20, 40, 50, 100, 200, 500, 1000]  # 0 = off


def _ladder_step(ladder: list[int], value: int, direction: int) -> int:
    if direction > 0:
        return next((v for v in ladder if v > value), ladder[-1])
    return next((v for v in reversed(ladder) if v < value), ladder[0])


SEEDS = 100_000  # new seeds have at most five digits


def adjust(
    settings: SamplingSettings, name: str, direction: int = 1, restore_temperature: float = DEFAULT_SETTINGS.temperature
) -> SamplingSettings:
    """One notch of `name` in `direction` (+1 up, -1 down).

    'greedy' toggles temperature 0 on, or off back to `restore_temperature`; 'seed' draws a new seed; a
    preset's name (contract.presets) sets its task's settings at once.
    """
    s = settings
    if name in BY_NAME:
        return with_preset(s, BY_NAME[name])
    if name == "temperature":
        if s.greedy:
            return s.replace(temperature=0.1) if direction > 0 else s
        value = round(s.temperature + 0.1 * direction, 2)
        return s.replace(temperature=min(max(value, 0.1), 5.0))
    if name == "top_k":
        return s.replace(top_k=_ladder_step(TOP_K_LADDER, s.top_k, direction))
    if name == "top_p":
        return s.replace(top_p=min(max(round(s.top_p + 0.05 * direction, 2), 0.05), 1.0))
    if name == "min_p":
        return s.replace(min_p=min(max(round(s.min_p + 0.05 * direction, 2), 0.0), 0.95))
    if name == "repetition_penalty":
        return s.replace(repetition_penalty=min(max(round(s.repetition_penalty + 0.1 * direction, 2), 0.1), 3.0))
    if name == "greedy":
        return s.replace(temperature=restore_temperature if s.greedy else 0.0)
    if name == "seed":  # the next of a fixed sequence of short seeds, easy to read out and type again
        seed = (s.seed * 7919 + 104_729) % SEEDS
        return s.replace(seed=seed if seed != s.seed else (seed + 1) % SEEDS)
    raise ValueError(f"unknown setting {name!r}")


class Nudges:
    """The settings keys' nudges, applied in order, remembering the temperature that turning greedy
    off returns to (the last one before greedy was turned on)."""

    def __init__(self, settings: SamplingSettings):
        self.warm_temperature = settings.temperature or DEFAULT_SETTINGS.temperature

    def apply(self, settings: SamplingSettings, name: str, direction: int = 1) -> SamplingSettings:
        if not settings.greedy:
            self.warm_temperature = settings.temperature
        return adjust(settings, name, direction, restore_temperature=self.warm_temperature)
