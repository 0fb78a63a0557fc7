"""A sparse autoencoder's reading of the residual stream at one position: which of its features are active
and how much, what share of the residual each explains, how many are on and what it leaves unexplained.
Plain data: tokenviz.features computes it."""

from __future__ import annotations

from dataclasses import dataclass

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.text import is_count

FEATURE_WATCH = "feature:"  # how --watch and the watch dialog name a feature: feature:SAE:ID
LABEL_TOKENS = 5  # a feature's label: the tokens its decoder row promotes most, and suppresses most
LABELLED = 12  # features the features view asks labels for, each SAE's strongest first (what it shows)
MOVED = 8  # features a comparison names at a step, those moved most first


@dataclass(frozen=True)
class FeatureActivation:
    id: int  # the feature: its row of the SAE's decoder
    activation: float  # as the SAE's own encode gives it
    share: float  # of the residual's squared norm, its decoder row × activation projected on the residual


@dataclass(frozen=True)
class FeatureReading:
    """One SAE at one position: its active features, strongest first (at most `shown` of `l0`)."""

    sae: str  # the SAE's name (its folder's)
    layer: int  # the residual after this decoder layer
    position: int
    features: tuple[FeatureActivation, ...]
    l0: int  # how many features are active
    error: float  # the reconstruction's error: |residual - decoded| / |residual|


@dataclass(frozen=True)
class WatchedFeature:
    """A feature followed through the journey: its activation at each of `positions` (a snapshot's: each
    step's position, the last prompt token's on)."""

    sae: str
    id: int
    positions: tuple[int, ...]
    activations: tuple[float, ...]


@dataclass(frozen=True)
class FeatureLabel:
    """A feature labelled from what the model and the SAE hold: the tokens its decoder row promotes and
    suppresses most, read through the model's final norm and output head (a lens of the feature); and what
    files beside the SAE say of it (features.feature_notes)."""

    sae: str
    id: int
    promotes: tuple[str, ...]  # the tokens' texts, most first
    suppresses: tuple[str, ...]
    promote_ids: tuple[int, ...] = ()
    suppress_ids: tuple[int, ...] = ()
    description: str = ""  # Neuronpedia's, where its export is beside the SAE
    contexts: tuple[str, ...] = ()  # its top-activating contexts, where `tokenviz sae-index` wrote them


@dataclass(frozen=True)
class FeatureReadings:
    """Every SAE loaded, read at one position of the journey (the features view's answer)."""

    position: int
    readings: tuple[FeatureReading, ...]  # in the order the SAEs were given
    ids: tuple[int, ...]  # the journey's tokens up to the position, as read (another path reads again)

    def shown(self) -> tuple[tuple[str, int], ...]:
        """(SAE, feature) of each reading's strongest features: those the view labels."""
        return tuple((r.sae, f.id) for r in self.readings for f in r.features[:LABELLED])


@dataclass(frozen=True)
class FeatureLabels:
    """Features' labels (the features view's second answer, asked once its readings are on screen: a label
    reads the whole output head, which costs more than the reading itself)."""

    labels: tuple[FeatureLabel, ...]

    def label_of(self, sae: str, feature: int) -> FeatureLabel | None:
        return next((label for label in self.labels if (label.sae, label.id) == (sae, feature)), None)


def is_feature_watch(text: object) -> bool:
    return isinstance(text, str) and text.startswith(FEATURE_WATCH)


def parse_feature_watch(text: str) -> tuple[str, int]:
    """`feature:SAE:ID` (SAE an SAE's name, which may hold colons): (the SAE's name, the feature)."""
    sae, _, feature = text[len(FEATURE_WATCH) :].rpartition(":")
    if not sae or not is_count(feature):
        raise SettingsError(f"a feature is watched as feature:SAE:ID, as feature:my-sae:123; got {text!r}")
    return sae, int(feature)


@dataclass(frozen=True)
class MovedFeature:
    id: int
    a: float  # its activation in A's residual
    b: float  # and in B's, at the same position of the same tokens


@dataclass(frozen=True)
class FeatureMoves:
    """One SAE at one position of a comparison (two runtimes, a model and its quantized self): the features
    whose activations differ most between A's residual and B's, both read on A's tokens."""

    sae: str
    layer: int
    position: int
    features: tuple[MovedFeature, ...]  # the most moved first (MOVED at most; none where none moved)
    a_l0: int
    b_l0: int
