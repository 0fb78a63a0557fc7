"""What the UI can ask of a worker: commands as frozen dataclasses.

A command that asks for a view's result is a Request[R]: the snapshots after it carry its newest
result, of type R (Snapshot.result(kind)). A new view is one pane, one Request and one result type.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from tokenviz.contract.attention import window
from tokenviz.contract.features import FeatureLabels, FeatureReadings
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import Entries
from tokenviz.contract.results import (
    Attribution,
    AttributionMethod,
    BeamResult,
    Inspection,
    LogitDifference,
    Speculation,
    Verification,
)

R = TypeVar("R")


class Request(Generic[R]):
    """A command whose answer is a view's result of type R, carried by every later snapshot."""

    result_type: ClassVar[type]  # R, at run time

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                cls.result_type = typing.get_args(base)[0]


@dataclass(frozen=True)
class Step:
    """Take the pending token (or `token` instead: a forced step) and run the model once more."""

    token: int | None = None


@dataclass(frozen=True)
class Force:
    """Take the rank-th token of the model's raw distribution instead of the pending one."""

    rank: int


@dataclass(frozen=True)
class BranchAt:
    """Rewind `steps_back` tokens and take the rank-th token there (the old path is kept)."""

    steps_back: int
    rank: int


@dataclass(frozen=True)
class SwitchBranch:
    index: int  # in the branch store


@dataclass(frozen=True)
class Rewind:
    n: int = 1


@dataclass(frozen=True)
class Reset:
    """Back to the prompt (the path left is kept as a branch)."""


@dataclass(frozen=True)
class Start:
    """Tokenize and prefill a new prompt: plain text, or with `chat` a user message (after `system`)
    put through the model's chat template."""

    prompt: str
    chat: bool = False
    system: str | None = None


@dataclass(frozen=True)
class Continue:
    """Force a text of the user's own through the journey, one forced step a token at autoplay's
    pace, so each token's probability is the model's surprise at it. Any move takes over."""

    text: str


@dataclass(frozen=True)
class Adjust:
    """Nudge one sampling setting a notch (see tokenviz.decoding.nudges)."""

    name: str
    direction: int = 1


@dataclass(frozen=True)
class Assign:
    """Sampling settings typed as NAME=VALUE (SamplingSettings.changed), applied in order with the
    nudges; the pending token is re-decided under them."""

    assignments: tuple[str, ...]


@dataclass(frozen=True)
class Constrain:
    """Set, change or clear (None) the grammar the generated text must follow; the pending token is
    re-decided under it. One the text so far leaves is refused."""

    grammar: Grammar | None


@dataclass(frozen=True)
class Intervene:
    """The interventions listed, each on or off: those on change the model from now on (the cache is
    fed again under them and the pending token re-decided). A list refused leaves the old one."""

    entries: Entries


@dataclass(frozen=True)
class Pace:
    """Autoplay slower (+1) or faster (-1), through PACES_S."""

    delta: int


@dataclass(frozen=True)
class Play:
    on: bool | None = None  # None toggles


@dataclass(frozen=True)
class Inspect(Request[Inspection]):
    """The embedding and logit lens at `position`: of the lens `rows` a view shows (Inspection rows: 0 the
    embeddings, i after layer i - 1), or of every row the journey's lens may show (Snapshot.lens_rows)."""

    position: int
    rows: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Attribute(Request[Attribution]):
    """Which tokens up to `position` led to the token after it (see tokenviz.backends.transformers.attribution)."""

    position: int
    method: AttributionMethod = "loo"


@dataclass(frozen=True)
class Watch:
    """Watch a token at every step, or stop watching it (see tokenviz.journey.watching)."""

    token: int | str  # an id, or a text of one token ("id:N" also names an id)


@dataclass(frozen=True)
class ReadFeatures(Request[FeatureReadings]):
    """Every SAE loaded, read in the residual at `position` (the pass that gave the token after it)."""

    position: int


@dataclass(frozen=True)
class LabelFeatures(Request[FeatureLabels]):
    """The labels of these (SAE name, feature)s (the features view asks once its readings are shown)."""

    features: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AddSae:
    """Load the SAEs in `folder` beside those loaded (checked against the model: one line if it cannot feed
    them)."""

    folder: str


@dataclass(frozen=True)
class SplitDifference(Request[LogitDifference]):
    """The logit difference of the two tokens watched last, after `position`, split by layer."""

    position: int


@dataclass(frozen=True)
class Verify(Request[Verification]):
    """Recompute the latest step without the cache and compare."""


@dataclass(frozen=True)
class Beams(Request[BeamResult]):
    width: int
    steps: int = 10


DEFAULT_DRAFTER = (
    "default"  # the engine's own choice: the model's middle layer where it can draft so, else prompt-lookup
)


@dataclass(frozen=True)
class Speculate(Request[Speculation]):
    drafter: str  # prompt-lookup, early-exit:LAYER, draft-model or DEFAULT_DRAFTER
    steps: int = 16


@dataclass(frozen=True)
class ShowLens:
    """From now on, the frame after each step carries the lens and embedding (an Inspection) at the newest
    position, of the lens `rows` (Inspection rows; None: every row the journey's lens may show; (): none,
    which stops it), read in the step's own pass where the engine can: during autoplay too, and no
    Inspect asked after the frame."""

    rows: tuple[int, ...] | None = ()


@dataclass(frozen=True)
class ShowAttention:
    """From now on, every snapshot carries one layer's attention for `rows` query rows around
    `cursor` (None: the newest position); rows=0 stops it."""

    layer: int
    rows: int
    cursor: int | None = None

    def resolve(self, positions: int, layers: int, paged: bool = False) -> tuple[int, range]:
        """(layer, query rows) to show for a journey of `positions` positions through the model and
        `layers` layers: the layer and the cursor kept within them; `paged` while autoplay runs (see
        contract.attention.window)."""
        cursor = positions - 1 if self.cursor is None else min(self.cursor, positions - 1)
        return min(self.layer, layers - 1), window(cursor, positions, self.rows, paged)


@dataclass(frozen=True)
class PageView:
    """Where a journey's HTML page opens: the app's layer (0-based; None: the last), head ("mean",
    "max" or a head's number) and cursor (a token position; None: the newest)."""

    layer: int | None = None
    head: str = "mean"
    cursor: int | None = None


@dataclass(frozen=True)
class Save:
    """Save the journey, with the attention rows a file keeps, as a replayable JSON file; with
    `page_colors` (a theme's, see ui.colors.page_colors) also as an HTML page beside it, opening
    where the app was (`page_view`)."""

    path: str
    page_colors: tuple[tuple[str, str | tuple[str, ...]], ...] = ()
    page_view: PageView = PageView()


Command = (
    Step
    | Force
    | BranchAt
    | SwitchBranch
    | Rewind
    | Reset
    | Start
    | Continue
    | Adjust
    | Assign
    | Constrain
    | Intervene
    | Play
    | Pace
    | Inspect
    | Attribute
    | Watch
    | ReadFeatures
    | LabelFeatures
    | AddSae
    | SplitDifference
    | Verify
    | Beams
    | Speculate
    | ShowAttention
    | ShowLens
    | Save
)

# Commands that change the journey pause autoplay first; settings and view changes do not.
Move = Step | Force | BranchAt | SwitchBranch | Rewind | Reset | Start | Continue
