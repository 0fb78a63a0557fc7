"""Changes made to the model while it runs, as the user names them: a head ablated, the residual stream
steered. Plain data; tokenviz.backends.transformers.intervention_hooks turns them into hooks."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.text import is_count, safe_text, shortened

MAX_INTERVENTIONS = 16
MAX_STEER_TEXT = 2_000  # characters of a steering text (it is read by the model once)
LABEL_CHARS = 16  # of a text quoted in an intervention's label


@dataclass(frozen=True)
class HeadAblation:
    """A head's output, before the attention output projection, set to zero or to its mean over the
    journey's context when it was set."""

    layer: int
    head: int
    mean: bool = False

    @property
    def label(self) -> str:
        return f"ablate L{self.layer}.H{self.head} ({'mean' if self.mean else 'zero'})"


MAX_STEER_SCALE = 3.4028234663852886e38  # float32's largest: a larger scale makes the vector infinite


@dataclass(frozen=True)
class Steering:
    """`scale` times a direction added to the residual stream after `layer`, at every position. The
    direction is, `by` texts, the residual after that layer at the last token of `toward` minus the
    same for `away`, each read alone (contrastive activation addition); `by` tokens, the difference
    of the two tokens' unembedding rows (`toward` and `away` each one token's text, or id:N)."""

    layer: int
    scale: float
    toward: str
    away: str
    by: Literal["texts", "tokens"] = "texts"

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale):
            raise SettingsError(f"a steering scale must be a number, got {self.scale}")
        if abs(self.scale) > MAX_STEER_SCALE:
            raise SettingsError(
                f"a steering scale is at most ±{MAX_STEER_SCALE:.3g}, float32's range (got {self.scale:g}): "
                "past it the vector is infinite"
            )
        if not self.toward or not self.away:
            raise SettingsError("steering needs two texts: toward and away")
        if max(len(self.toward), len(self.away)) > MAX_STEER_TEXT:
            raise SettingsError(f"a steering text is at most {MAX_STEER_TEXT:,} characters")
        if self.by not in ("texts", "tokens"):
            raise SettingsError(f"steering is by texts or tokens, got {self.by!r}")

    @property
    def label(self) -> str:
        toward, away = (safe_text(shortened(t, LABEL_CHARS)) for t in (self.toward, self.away))
        return f"steer L{self.layer} ×{self.scale:g} toward {toward!r} away from {away!r}"


class Suspendable:
    """Interventions in force that can be set aside: inside `suspended()` they are not (`active` False),
    and the model runs its own passes."""

    active: bool = True

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """The model as it is, for the passes (or requests) inside; nests."""
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was


BRANCH_SOURCE = re.compile(r"branch (\d+)")  # a patch's source naming a branch of the journey


@dataclass(frozen=True)
class Patch:
    """The residual stream after `layer` at `position` replaced by another run's there: `source`'s (a
    text read alone, its tokens as a prompt would have them), or, where `source` is `branch N`, that
    branch's tokens (`source_ids`, filled in when it is set), at the same position."""

    layer: int
    position: int
    source: str
    source_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.position < 0:
            raise SettingsError(f"a patch's position counts from 0, got {self.position}")
        if not self.source or len(self.source) > MAX_STEER_TEXT:
            raise SettingsError(f"a patch's source is a text of 1 to {MAX_STEER_TEXT:,} characters")

    @property
    def label(self) -> str:
        source = safe_text(shortened(self.source, LABEL_CHARS))
        return f"patch L{self.layer}@{self.position} from {source!r}"


UNRESOLVED = -1  # the layer of a feature's intervention typed before its SAE was found (features.feature_edits)


@dataclass(frozen=True)
class FeatureSteering:
    """`scale` times a sparse autoencoder's feature, its decoder row as the SAE's decode writes it, added to
    the residual stream after the SAE's layer at every position. The SAE is named by its name among those
    loaded and the folder it was read from (filled in, with its layer, when it is set)."""

    sae: str
    feature: int
    scale: float
    layer: int = UNRESOLVED
    folder: str = ""

    def __post_init__(self) -> None:
        _check_feature(self.feature, self.scale, "strength")

    @property
    def label(self) -> str:
        return f"steer{_at(self.layer)} ×{self.scale:g} by {safe_text(shortened(self.sae, LABEL_CHARS))}#{self.feature}"


@dataclass(frozen=True)
class FeatureClamp:
    """A sparse autoencoder's feature held at `value` in the residual after its layer, at every position: the
    residual plus (value - the feature's activation there) times its decoder row, which is the SAE's
    reconstruction with that activation set, plus the SAE's error (the rest of the residual untouched)."""

    sae: str
    feature: int
    value: float
    layer: int = UNRESOLVED
    folder: str = ""

    def __post_init__(self) -> None:
        _check_feature(self.feature, self.value, "value")

    @property
    def label(self) -> str:
        return f"clamp{_at(self.layer)} ={self.value:g} {safe_text(shortened(self.sae, LABEL_CHARS))}#{self.feature}"


def _at(layer: int) -> str:
    return "" if layer == UNRESOLVED else f" L{layer}"


def _check_feature(feature: int, amount: float, what: str) -> None:
    if feature < 0:
        raise SettingsError(f"a feature is its row of the SAE, from 0; got {feature}")
    if not math.isfinite(amount) or abs(amount) > MAX_STEER_SCALE:
        raise SettingsError(f"a feature's {what} is a number within ±{MAX_STEER_SCALE:.3g}, got {amount}")


FeatureIntervention = FeatureSteering | FeatureClamp
Intervention = HeadAblation | Steering | Patch | FeatureSteering | FeatureClamp
KINDS: dict[type[Intervention], str] = {
    HeadAblation: "ablate",
    Steering: "steer",
    Patch: "patch",
    FeatureSteering: "sae-steer",
    FeatureClamp: "sae-clamp",
}  # as a file names them


def kind_of(intervention: Intervention) -> str:
    """How a file names the intervention's kind beside its fields (files.record_json.intervention_json)."""
    return KINDS[type(intervention)]


def _plain(value: object) -> int | float | str:
    """A JSON scalar, for int(), float() or str() to read (TypeError for anything else)."""
    if isinstance(value, int | float | str):
        return value
    raise TypeError(type(value).__name__)


def intervention_from_json(d: object) -> Intervention:
    """The intervention a file holds ({"kind", and its fields}); one line where it is not one."""
    try:
        if not isinstance(d, Mapping):
            raise TypeError("not an object")
        if d["kind"] == "ablate":
            return HeadAblation(layer=int(_plain(d["layer"])), head=int(_plain(d["head"])), mean=bool(d["mean"]))
        if d["kind"] == "steer" and d["by"] in ("texts", "tokens"):
            return Steering(
                layer=int(_plain(d["layer"])),
                scale=float(_plain(d["scale"])),
                toward=str(_plain(d["toward"])),
                away=str(_plain(d["away"])),
                by="texts" if d["by"] == "texts" else "tokens",
            )
        if d["kind"] == "patch":
            given = d.get("source_ids", ())
            ids = tuple(int(_plain(t)) for t in (given if isinstance(given, list | tuple) else [given]))
            position, source = int(_plain(d["position"])), str(_plain(d["source"]))
            return Patch(layer=int(_plain(d["layer"])), position=position, source=source, source_ids=ids)
        if d["kind"] in ("sae-steer", "sae-clamp"):
            kind = FeatureSteering if d["kind"] == "sae-steer" else FeatureClamp
            amount = float(_plain(d["scale" if kind is FeatureSteering else "value"]))
            sae, feature = str(_plain(d["sae"])), int(_plain(d["feature"]))
            layer, folder = int(_plain(d["layer"])), str(_plain(d["folder"]))
            return kind(sae, feature, amount, layer, folder)
    except (KeyError, TypeError, ValueError):
        pass
    raise SettingsError(f"not an intervention: {str(d)[:60]!r}")


def parse_ablation(text: str, mean: bool = False) -> HeadAblation:
    """`LAYER.HEAD`, as --ablate takes it (layers and heads from 0)."""
    layer, dot, head = text.strip().partition(".")
    try:
        if not dot:
            raise ValueError
        return HeadAblation(layer=int(layer), head=int(head), mean=mean)
    except ValueError:
        raise SettingsError(f"--ablate takes LAYER.HEAD (from 0), as 5.3; got {text!r}") from None


def parse_steering(text: str, by: Literal["texts", "tokens"] = "texts") -> Steering:
    """`LAYER:SCALE:TOWARD:AWAY`, as --steer (two texts) and --steer-tokens (two tokens) take it; the
    texts may hold colons after the third. A token is its text or `id:N`, on either side."""
    option = "--steer" if by == "texts" else "--steer-tokens"
    parts = text.split(":", 2)
    pair = _TOKEN_PAIR.match(parts[2]) if len(parts) == 3 and by == "tokens" else None
    if pair is not None:
        parts = [parts[0], parts[1], pair.group(1), pair.group(2)]
    elif by == "texts":
        parts = text.split(":", 3)
    if len(parts) != 4:
        example = "6:4:Love:Hate" if by == "texts" else "6:4: Paris:id:42"
        raise SettingsError(f"{option} takes LAYER:SCALE:TOWARD:AWAY, as {example}; got {text!r}")
    layer, scale, toward, away = parts
    try:
        return Steering(layer=int(layer), scale=float(scale), toward=toward, away=away, by=by)
    except ValueError:
        raise SettingsError(f"{option}: LAYER is an integer and SCALE a number; got {text!r}") from None


_TOKEN_PAIR = re.compile(r"(id:\d+|[^:]*):(.*)\Z", re.DOTALL)  # two tokens, each its text or id:N


def parse_patch(text: str) -> Patch:
    """`LAYER:POSITION:TEXT`, as --patch takes it (TEXT may be `branch N` in the app)."""
    parts = text.split(":", 2)
    try:
        if len(parts) != 3:
            raise ValueError
        return Patch(layer=int(parts[0]), position=int(parts[1]), source=parts[2])
    except ValueError:
        raise SettingsError(f"--patch takes LAYER:POSITION:TEXT (from 0), as 8:3:The dog sat; got {text!r}") from None


def parse_feature_intervention(text: str, clamp: bool = False) -> FeatureIntervention:
    """`SAE:ID:STRENGTH`, as --sae-steer takes it, or `SAE:ID:VALUE` (--sae-clamp): SAE an SAE's name (its
    folder's) among those loaded, which may hold colons; its layer and folder are filled in when it is set."""
    option = "--sae-clamp" if clamp else "--sae-steer"
    sae, _, rest = text.rpartition(":")
    sae, _, feature = sae.rpartition(":")
    try:
        if not sae:
            raise ValueError
        if clamp:
            return FeatureClamp(sae=sae, feature=int(feature), value=float(rest))
        return FeatureSteering(sae=sae, feature=int(feature), scale=float(rest))
    except ValueError:
        what = "VALUE" if clamp else "STRENGTH"
        raise SettingsError(f"{option} takes SAE:ID:{what}, as my-sae:123:4 (ID from 0); got {text!r}") from None


def check_patch_source(patch: Patch, held: int) -> None:
    """Refuse, in one line, a patch whose position its source's `held` tokens do not reach."""
    if not 0 <= patch.position < held:
        has = {0: "no tokens", 1: "position 0 only"}.get(held, f"positions 0-{held - 1}")
        raise SettingsError(f"{patch.label}: its source has {has}: no position {patch.position}")


def check_against(interventions: tuple[Intervention, ...], layers: int, heads: int) -> None:
    """Refuse, in one line, an intervention outside the model (a layer or head it does not have)."""
    if len(interventions) > MAX_INTERVENTIONS:
        raise SettingsError(f"at most {MAX_INTERVENTIONS} interventions at once")
    for i in interventions:
        if isinstance(i, FeatureSteering | FeatureClamp) and i.layer == UNRESOLVED:
            continue  # checked when its SAE is found (features.feature_edits.with_sae)
        if not 0 <= i.layer < layers:
            raise SettingsError(f"{i.label}: the model's layers are 0-{layers - 1}")
        if isinstance(i, HeadAblation) and not 0 <= i.head < heads:
            raise SettingsError(f"{i.label}: the model's heads are 0-{heads - 1}")


Entries = tuple[tuple[Intervention, bool], ...]  # the interventions listed, each on or off


def entries_changed(before: Entries, after: Entries) -> str:
    """What an edit of the list does, in a few words ("ablate L10.H1 (zero): on"; "2 changed"): said
    the moment it is asked, before the model has run again under it."""
    was, now = dict(before), dict(after)
    changes = [
        f"{i.label}: {'removed' if i not in now else 'on' if now[i] else 'off'}"
        for i in dict.fromkeys([*was, *now])
        if was.get(i) != now.get(i)
    ]
    if not changes:
        return "no change"
    return changes[0] if len(changes) == 1 else f"{len(changes)} interventions changed"


def edit_entries(line: str, entries: Entries) -> Entries:
    """The list after one typed edit: `ablate L.H`, `ablate L.H mean`, `steer L:S:TOWARD:AWAY`,
    `steer-tokens L:S:A:B`, `patch L:P:TEXT`, `sae-steer SAE:ID:S`, `sae-clamp SAE:ID:V` add one (on);
    `N` turns entry N (from 1) off or on, `-N` removes it; `clear` removes them all."""
    text = line.strip()
    word, _, rest = text.partition(" ")
    number = text.lstrip("-")
    if text.lower() == "clear":
        return ()
    if is_count(number):
        n = int(number)
        if not 1 <= n <= len(entries):
            raise SettingsError(f"there is no intervention {n}: {len(entries)} listed")
        if text.startswith("-"):
            return entries[: n - 1] + entries[n:]
        return tuple((i, not on if k == n - 1 else on) for k, (i, on) in enumerate(entries))
    rest = rest.strip()
    if word == "ablate":
        target, _, how = rest.partition(" ")
        if how.strip() not in ("", "mean", "zero"):
            raise SettingsError(f"ablate LAYER.HEAD takes zero (the default) or mean after it, not {how.strip()!r}")
        added: Intervention = parse_ablation(target, mean=how.strip() == "mean")
    elif word == "steer":
        added = parse_steering(rest)
    elif word == "steer-tokens":
        added = parse_steering(rest, by="tokens")
    elif word == "patch":
        added = parse_patch(rest)
    elif word in ("sae-steer", "sae-clamp"):
        added = parse_feature_intervention(rest, clamp=word == "sae-clamp")
    else:
        raise SettingsError(
            "type ablate L.H [mean], steer L:SCALE:TOWARD:AWAY, steer-tokens L:SCALE:A:B, patch L:POS:TEXT, "
            "sae-steer SAE:ID:STRENGTH, sae-clamp SAE:ID:VALUE, N (on/off), -N (remove) or clear"
        )
    if len(entries) >= MAX_INTERVENTIONS:
        raise SettingsError(f"at most {MAX_INTERVENTIONS} interventions at once")
    return (*entries, (added, True))


def briefly(interventions: Sequence[Intervention]) -> str:
    """Each intervention by the first three words of its label (its kind, layer and size): "steer L1 ×8
    toward 'the' away from 'a'" as "steer L1 ×8…", where whole labels would not fit."""
    words = [i.label.split() for i in interventions]
    return ", ".join(" ".join(w[:3]) + ("…" if len(w) > 3 else "") for w in words)
