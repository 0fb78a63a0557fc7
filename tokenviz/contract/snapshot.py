"""The Snapshot: everything the panes show at one moment, as frozen plain data.

The engine thread publishes one after each batch of commands; the UI only ever reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar, cast

from pydantic import JsonValue

from tokenviz.contract.attention import AttentionView
from tokenviz.contract.commands import Request
from tokenviz.contract.features import WatchedFeature
from tokenviz.contract.interventions import Entries
from tokenviz.contract.records import ModelInfo, StepRecord, TokenChip
from tokenviz.contract.results import BranchSummary, CacheEvent, StepDiff, ViewResult
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.symptoms import Symptom

R = TypeVar("R")
CANCELS = "(Escape cancels)"  # how a running job's progress line ends (the UI says "cancelling" there)

EngineState = Literal[
    "loading",
    "prefilling",
    "ready",
    "stepping",
    "verifying",
    "searching beams",
    "speculating",
    "attributing",
    "reading features",
    "watching",
    "playing",
    "stopped",
    "error",
]


@dataclass(frozen=True)
class Frame:
    """What a worker publishes, in order (`seq`): its state, and a line saying what it does now."""

    seq: int
    state: EngineState
    message: str = ""
    computing: str = ""  # the view whose result is being computed while `message` says so (its pane notes it)


@dataclass(frozen=True)
class Took:
    """The last command that ran the model, timed on the engine thread from its turn to its frame: the
    whole (ms), and its parts by name (the forward pass, the decision, the views' passes, the rest)."""

    ms: float
    parts: tuple[tuple[str, float], ...] = ()

    def part(self, name: str) -> float | None:
        return next((ms for part, ms in self.parts if part == name), None)


@dataclass(frozen=True)
class Snapshot(Frame):
    """Everything the panes show, as plain data, at one moment."""

    progress: float | None = None
    info: ModelInfo | None = None
    settings: SamplingSettings = field(default_factory=SamplingSettings)
    prompt: str = ""  # the text given: the whole prompt, or the user's message in chat mode
    chat: bool = False  # the prompt went through the model's chat template
    system: str | None = None  # the system message given with it
    chips: tuple[TokenChip, ...] = ()
    prompt_len: int = 0
    records: tuple[StepRecord, ...] = ()
    stop_reason: str | None = None
    playing: bool = False
    pace_s: float = 0.0  # autoplay's least time between steps (0: as fast as it runs)
    tokens_per_s: float | None = None  # the engine's rate, all work included, over the last rate_steps steps
    forward_tokens_per_s: float | None = None  # the forward passes' alone, over the same steps
    rate_steps: int = 0
    error: str | None = None  # one line, for a notification
    notice: str | None = None  # one line of news, for a notification (a file saved)
    attention: AttentionView | None = None  # the rows the attention pane asked for (see ShowAttention)
    handled: int = 0  # commands handled before this snapshot (tests wait on it)
    results: tuple[ViewResult, ...] = ()  # the newest result of each kind of request (see result)
    lens_ms: tuple[int, float] | None = None  # (position, ms) of the logit lens last computed: its own cost
    lens_rows: tuple[int, ...] | None = None  # the lens rows chosen (--lens-layers); None: every layer's
    cancelled: tuple[str, ...] = ()  # the kinds of request (class names) whose last run was cancelled
    failed: tuple[tuple[str, str], ...] = ()  # (kind, its one line) of the requests whose last run was refused
    cache_event: CacheEvent | None = None  # of the last rewind or branch switch
    live: bool = True  # False for a recording: nothing can run the model
    branches: tuple[BranchSummary, ...] = ()  # the current path first, then the others
    text: str = ""  # the generated text, decoded
    full_text: str = ""  # prompt and generated text, decoded
    pinned: tuple[tuple[int, str], ...] = ()  # the watched tokens (id, text), followed at every step
    watched_features: tuple[WatchedFeature, ...] = ()  # the features followed (w feature:SAE:ID), each step's
    interventions: Entries = ()  # the interventions listed, each on or off (those on change the model)
    why: tuple[Symptom, ...] = ()  # once it has stopped, each symptom of its text (journey.diagnosis)
    took: Took | None = None  # the last step's (or rewind's, or steering's) whole time, with its parts

    @property
    def pending(self) -> StepRecord | None:
        """The record whose decision is still a preview (None once generation stopped)."""
        return self.records[-1] if self.records and self.stop_reason is None else None

    @property
    def latest(self) -> StepRecord | None:
        return self.records[-1] if self.records else None

    def result(self, kind: type[Request[R]]) -> R | None:
        """The newest result of a request of this kind (Inspect, Attribute, Beams, ...), if any."""
        return next((cast(R, value) for value in self.results if isinstance(value, kind.result_type)), None)


@dataclass(frozen=True)
class ComparisonSnapshot(Frame):
    """Two journeys on one prompt, stepped together (tokenviz compare), and how they differ."""

    a: Snapshot | None = None
    b: Snapshot | None = None
    diffs: tuple[StepDiff, ...] = ()  # one per step both have taken or have pending
    parted_at: int | None = None  # the first step where their chosen tokens differ
    statistics: Mapping[str, JsonValue] | None = (
        None  # llama-perplexity's, B the base (journey.comparison.journey_statistics)
    )
    kl_over: str = ""  # over what the KL is taken, where not the whole vocabulary (a served B: its top N)
    independent_draws: bool = False  # each side draws on its own (a served B): a parting may be two draws
    playing: bool = False
    pace_s: float = 0.0  # autoplay's least time between steps (0: as fast as it runs)
    error: str | None = None
    notice: str | None = None  # one line of news (files saved)
    handled: int = 0  # commands handled before this snapshot (tests wait on it)
