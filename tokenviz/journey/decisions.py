"""How a journey's next token is decided: a strategy chosen once per engine.

A local model gives its logits, and the decision is made here (decoding.sampling: every stage over the
whole vocabulary, the draw from the session's seed). A server draws its own token with the settings sent to
it (contract.engine.DrawingEngine), and the record is built from its draw and its top N (decoding.drawn).
Either way, every number of the record reaches the host in one transfer, and the session only places the
record in the journey."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from tokenviz.contract import records
from tokenviz.contract.engine import DrawingEngine, Engine, Intervening
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import Candidate, StepRecord, Unsteered
from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.drawn import drawn_decision, drawn_top, drawn_unsteered, forced_figures
from tokenviz.decoding.sampling import decide, decide_on_device, summarise
from tokenviz.decoding.unsteered import read_unsteered, unsteered_on_device
from tokenviz.journey.grammar_state import GrammarState
from tokenviz.tensors.threads import one_thread_on_cpu
from tokenviz.tensors.transfer import to_host


class Journey(Protocol):
    """What a decision reads of the journey (a Session)."""

    ids: list[int]
    records: list[StepRecord]
    settings: SamplingSettings
    pinned: tuple[int, ...]
    top_n: int
    intervening: Intervening | None

    @property
    def generated_ids(self) -> list[int]: ...

    @property
    def cached_ids(self) -> list[int]: ...

    @property
    def interventions(self) -> tuple[Intervention, ...]: ...

    @property
    def grammars(self) -> GrammarState: ...


@dataclass(frozen=True)
class Decided:
    """The next token's decision after a journey's ids and what it was made from: the step record's
    fields of the same names (the session builds the record once, with the pass's)."""

    top: tuple[Candidate, ...]
    entropy: float
    decision: records.Decision
    interventions: tuple[Intervention, ...]
    unsteered: Unsteered | None = None
    ms: float = 0.0  # what the decision took beyond the pass (a drawing engine's request)

    def onto(self, record: StepRecord) -> StepRecord:
        """The pending `record` with this decision in its place (the model changed under it)."""
        return dataclasses.replace(
            record,
            top=self.top,
            entropy=self.entropy,
            decision=self.decision,
            interventions=self.interventions,
            unsteered=self.unsteered,
        )


class Decision(Protocol):
    def record(
        self, journey: Journey, logits: torch.Tensor | None, extra: dict[str, torch.Tensor] | None = None
    ) -> tuple[Decided, dict[str, np.ndarray]]:
        """The next token's decision after `journey.ids` (its top-n, decision and, with interventions in
        force, the model's own distribution there) and the host's copy of the tensors with `extra`, in
        one transfer."""

    def redecide(self, journey: Journey, logits: torch.Tensor | None, forced_id: int | None = None) -> StepRecord:
        """The pending record (`journey.records[-1]`) decided again with the settings now; `forced_id`
        taken instead of a draw."""


class LocalDecision:
    """Decided here, on the model's logits."""

    def __init__(self, engine: Engine):
        self.piece = engine.piece

    def record(
        self, journey: Journey, logits: torch.Tensor | None, extra: dict[str, torch.Tensor] | None = None
    ) -> tuple[Decided, dict[str, np.ndarray]]:
        assert logits is not None  # only a drawing engine's forward gives none
        allowed = journey.grammars.allowed(journey.settings, journey.generated_ids)
        with one_thread_on_cpu(logits.device):  # once for both
            summary = summarise(logits, journey.top_n)
            decision = decide_on_device(
                logits,
                journey.settings,
                journey.ids,
                journey.generated_ids,
                pinned=journey.pinned,
                allowed=allowed,
                summary=summary,
            )
        own, own_timer = {}, None
        if journey.intervening is not None:
            own_logits, own_timer = journey.intervening.own_logits(journey.cached_ids)
            assert not isinstance(own_logits, Drawn), "an engine that decides here gives its scores"
            own = unsteered_on_device(logits, own_logits, journey.top_n)
        host = to_host({**summary.tensors, **decision.tensors, **own, **(extra or {})})
        top, entropy = summary.read(host, self.piece)
        unsteered = read_unsteered(host, self.piece, own_timer) if own_timer else None
        return Decided(top, entropy, decision.read(host, self.piece), journey.interventions, unsteered), host

    def redecide(self, journey: Journey, logits: torch.Tensor | None, forced_id: int | None = None) -> StepRecord:
        assert logits is not None
        decision = decide(
            logits,
            journey.settings,
            journey.ids,
            journey.generated_ids,
            self.piece,
            forced_id,
            journey.pinned,
            journey.grammars.allowed(journey.settings, journey.generated_ids),
        )
        return dataclasses.replace(journey.records[-1], decision=decision)


class DrawnDecision:
    """Drawn by the engine itself (a server): the record is its draw, the stages shown beside it
    recomputed over its top N (see decoding.drawn)."""

    def __init__(self, engine: DrawingEngine):
        self.engine = engine
        self._drawn: Drawn | None = None  # the pending step's draw (a forced token is taken over it)

    def record(
        self, journey: Journey, logits: torch.Tensor | None, extra: dict[str, torch.Tensor] | None = None
    ) -> tuple[Decided, dict[str, np.ndarray]]:
        return self._decision_of(journey, self.engine.draw(journey.ids, journey.settings)), to_host(extra or {})

    def redecide(self, journey: Journey, logits: torch.Tensor | None, forced_id: int | None = None) -> StepRecord:
        """Its draw again with these settings; a forced token needs none."""
        kept = self._drawn if forced_id is not None else None
        drawn = kept or self.engine.draw(journey.ids, journey.settings)
        again = self._decision_of(journey, drawn, forced_id, own=False)  # its context, so its own, is the same
        return dataclasses.replace(journey.records[-1], top=again.top, entropy=again.entropy, decision=again.decision)

    def _decision_of(self, journey: Journey, drawn: Drawn, forced_id: int | None = None, own: bool = True) -> Decided:
        """The decision of `drawn`; `forced_id` taken instead; with `own` and interventions in force, the
        model's own distribution beside it (one more request)."""
        engine, ids = self.engine, list(journey.ids)
        self._drawn = drawn
        forced = (
            None if forced_id is None else forced_figures(drawn, forced_id, lambda: engine.logprob_of(ids, forced_id))
        )
        top, entropy = drawn_top(drawn, engine.piece, journey.top_n)
        decision = drawn_decision(
            drawn, journey.settings, ids, journey.generated_ids, engine.piece, engine.info.vocab, forced, journey.pinned
        )
        unsteered = None
        if own and journey.intervening is not None:  # a drawing engine's scores are its top N: a Drawn
            own_draw = journey.intervening.own_logits(ids)[0]
            assert isinstance(own_draw, Drawn), "an engine that draws gives its own distribution as a draw"
            unsteered = drawn_unsteered(drawn, own_draw, engine.piece, journey.top_n)
        return Decided(top, entropy, decision, journey.interventions, unsteered, ms=drawn.ms)


def decision_for(engine: Engine) -> Decision:
    """The engine's strategy, asked once: a protocol's isinstance reads every member."""
    return DrawnDecision(engine) if isinstance(engine, DrawingEngine) else LocalDecision(engine)


def record_again(decision: Decision, journey: Journey, logits: torch.Tensor | None) -> StepRecord:
    """The pending record made again from `logits` (a drawing engine's draw again): its top-n, decision,
    interventions and the model's own distribution beside them (the model changed under it)."""
    return decision.record(journey, logits)[0].onto(journey.records[-1])


def decided_again(decision: Decision, journey: Journey, logits: torch.Tensor | None) -> StepRecord:
    """The pending record after a move back to a step kept from before: its decision follows the current
    settings; where it was made under other interventions (the model has changed since), all of it is made
    again from the logits the model now gives."""
    if journey.records[-1].interventions != journey.interventions:
        return record_again(decision, journey, logits)
    return decision.redecide(journey, logits)
