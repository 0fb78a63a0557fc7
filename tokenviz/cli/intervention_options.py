"""`trace`'s interventions on the command line (--ablate, --ablate-mean, --steer, --steer-tokens, --patch,
--sae-steer, --sae-clamp),
declared once as a table and handed to the command parsed, as one `InterventionChoice`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import typer

from tokenviz.cli.options import option_group
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import (
    Intervention,
    parse_ablation,
    parse_feature_intervention,
    parse_patch,
    parse_steering,
)

PANEL = "Interventions"
REPEATED = Optional[list[str]]  # each option but --ablate-mean is given once per intervention


def _option(kind: Any, flag: str, help: str) -> tuple[Any, Any]:
    return kind, typer.Option(flag, help=help, rich_help_panel=PANEL)


INTERVENTION_OPTIONS: dict[str, tuple[Any, Any]] = {
    "ablate": _option(REPEATED, "--ablate", "LAYER.HEAD (from 0, repeatable): that head's output set to zero."),
    "ablate_mean": _option(bool, "--ablate-mean", "With --ablate: the head's mean over the prompt, not zero."),
    "steer": _option(
        REPEATED,
        "--steer",
        "LAYER:SCALE:TOWARD:AWAY (repeatable): SCALE times the residual after LAYER at the last token of TOWARD "
        "minus that of AWAY (each read alone), added after LAYER at every position.",
    ),
    "steer_tokens": _option(
        REPEATED,
        "--steer-tokens",
        "LAYER:SCALE:TOKEN_A:TOKEN_B (repeatable): the direction is TOKEN_A's unembedding row minus TOKEN_B's "
        "(each a token's text, or id:N).",
    ),
    "patch": _option(
        REPEATED,
        "--patch",
        "LAYER:POSITION:TEXT (repeatable): the residual after LAYER at POSITION (from 0) replaced by TEXT's there, "
        "TEXT read alone (another prompt, as long at least).",
    ),
    "sae_steer": _option(
        REPEATED,
        "--sae-steer",
        "SAE:ID:STRENGTH (repeatable): feature ID of the SAE named SAE (its folder's name, given with --sae), its "
        "decoder row times STRENGTH added after the SAE's layer at every position.",
    ),
    "sae_clamp": _option(
        REPEATED,
        "--sae-clamp",
        "SAE:ID:VALUE (repeatable): feature ID of the SAE named SAE held at VALUE after the SAE's layer at every "
        "position, the rest of the residual (the other features and the SAE's error) kept.",
    ),
}


@dataclass(frozen=True)
class InterventionChoice:
    """The intervention options as typed, and what they ask for, parsed (in force from the prompt on)."""

    ablate: tuple[str, ...] = ()
    ablate_mean: bool = False
    steer: tuple[str, ...] = ()
    steer_tokens: tuple[str, ...] = ()
    patch: tuple[str, ...] = ()
    sae_steer: tuple[str, ...] = ()
    sae_clamp: tuple[str, ...] = ()
    interventions: tuple[Intervention, ...] = ()  # a feature's without its SAE's layer until the SAEs are read


def intervention_choice(values: dict[str, Any], given: frozenset[str]) -> InterventionChoice:
    """The options parsed; one line (a TokenvizError) for one that cannot be."""
    names = ("ablate", "steer", "steer_tokens", "patch", "sae_steer", "sae_clamp")
    texts = {name: tuple(values.get(name) or ()) for name in names}
    mean = bool(values.get("ablate_mean"))
    if mean and not texts["ablate"]:
        raise TokenvizError("--ablate-mean goes with --ablate LAYER.HEAD")
    interventions: tuple[Intervention, ...] = (
        *(parse_ablation(a, mean=mean) for a in texts["ablate"]),
        *(parse_steering(s) for s in texts["steer"]),
        *(parse_steering(s, by="tokens") for s in texts["steer_tokens"]),
        *(parse_patch(p) for p in texts["patch"]),
        *(parse_feature_intervention(f) for f in texts["sae_steer"]),
        *(parse_feature_intervention(f, clamp=True) for f in texts["sae_clamp"]),
    )
    return InterventionChoice(**texts, ablate_mean=mean, interventions=interventions)


def intervention_options() -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the intervention options; it receives them as `interventions` (an InterventionChoice)."""
    return option_group("interventions", INTERVENTION_OPTIONS, intervention_choice)
