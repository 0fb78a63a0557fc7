"""What the views compute about a journey on demand: the logit lens at a position, attribution and
the split logit difference. Each is kept by the tokens it was computed on (the past does not
change), so moving the cursor back and forth costs one computation each; a journey file keeps the
ones about the current path."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, cast

from tokenviz.contract.engine import Capability, Engine, Lens, LogitSplitting, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.lens_layers import LensLayers
from tokenviz.contract.records import StepRecord
from tokenviz.contract.results import Analyses, Attribution, AttributionMethod, Inspection, LensAsk, LogitDifference
from tokenviz.journey.past_results import KEEP, PastResults


class Journey(Protocol):
    """What the analyses read of a journey (a Session is one)."""

    engine: Engine
    ids: list[int]  # prompt + committed tokens
    records: list[StepRecord]
    pinned: tuple[int, ...]  # the watched tokens

    @property
    def pending(self) -> StepRecord | None: ...


class JourneyAnalyses:
    def __init__(self, session: Journey):
        self.session = session
        self._inspections: PastResults[Inspection] = PastResults()
        self._attributions: PastResults[Attribution] = PastResults()
        self._differences: PastResults[LogitDifference] = PastResults()
        self.lens_layers: LensLayers | None = None  # the lens rows the views show (--lens-layers; None: all)
        self.lens_ms: tuple[int, float] | None = None  # (position, ms) of the lens last computed: its own cost

    def lens_rows(self) -> tuple[int, ...] | None:
        """The lens rows asked for, resolved against the model's layers (one line where one is not there)."""
        chosen = self.lens_layers
        return None if chosen is None else chosen.rows(self.session.engine.info.layers)

    def inspect(self, position: int, rows: tuple[int, ...] | None = None) -> Inspection:
        """Embedding, residual norms and logit lens at `position` (of the lens `rows` a view shows, or of
        every row chosen), the watched tokens followed too. Rows of the lens at every row, kept from before,
        cost nothing."""
        context, chosen = self._past(position)
        pinned, every = self.session.pinned, self.lens_rows()
        rows = every if rows is None else self._valid_rows(rows)
        lens: Lens = require(self.session.engine, Capability.LENS, "the logit lens")
        whole = self._inspections.kept((context, chosen, pinned, every))
        if whole is not None and rows is not None and whole.holds(rows):
            return replace(whole, lens=whole.rows_of(rows))

        def compute() -> Inspection:
            started = time.perf_counter()
            found = lens.inspect(LensAsk(tuple(context), (position,), (chosen,), pinned, rows))[0]
            self.lens_ms = (position, (time.perf_counter() - started) * 1e3)
            return found

        return self._inspections.get((context, chosen, pinned, rows), compute)

    def _valid_rows(self, rows: tuple[int, ...]) -> tuple[int, ...]:
        """A view's lens rows, each one the model has (0 to its layers), in order, once each."""
        layers = self.session.engine.info.layers
        if not rows or any(not 0 <= row <= layers for row in rows):
            raise TokenvizError(f"the lens rows asked are not among the model's (0 to {layers})")
        return tuple(sorted(set(rows)))

    def inspect_many(self, positions: list[int]) -> None:
        """Inspect several positions of the current path with one forward pass (the trace's lens at
        every step), each kept as `inspect` keeps it: at most as many as are kept at once."""
        pasts = [self._past(position) for position in positions[-KEEP:]]
        if not pasts:
            return
        pinned, longest, rows = self.session.pinned, max((context for context, _ in pasts), key=len), self.lens_rows()
        lens: Lens = require(self.session.engine, Capability.LENS, "the logit lens")
        followed = tuple(chosen for _, chosen in pasts)
        found = lens.inspect(LensAsk(tuple(longest), tuple(positions[-KEEP:]), followed, pinned, rows))
        for (context, chosen), inspection in zip(pasts, found):
            self._inspections.put((context, chosen, pinned, rows), inspection)

    def attribute(
        self,
        position: int,
        method: AttributionMethod,
        progress: Callable[[int, int], None] = lambda done, total: None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> Attribution:
        """How much each token up to `position` led to the token that followed it."""
        context, chosen = self._past(position)
        engine = self.session.engine
        attributing = (
            require(engine, Capability.ATTRIBUTION, "attribution")
            if method == "grad"
            else require(engine, Capability.LEAVE_ONE_OUT, "attribution")
        )

        def compute() -> Attribution:
            logprob, scores = attributing.attribute(list(context), chosen, method, progress, cancelled)
            return Attribution(method, position, chosen, engine.piece(chosen), logprob, tuple(scores))

        return self._attributions.get((context, chosen, method), compute)

    def logit_difference(
        self,
        position: int,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> LogitDifference:
        """logit(a) − logit(b) of the two tokens watched last (the pair a person just chose), after
        `position`, split by layer."""
        pinned = self.session.pinned
        if len(pinned) < 2:
            raise TokenvizError("watch two tokens (w) to split their logit difference by layer")
        context, _ = self._past(position)
        a, b = pinned[-2:]
        splitting: LogitSplitting = require(self.session.engine, Capability.LOGIT_SPLIT, "the logit split")
        return self._differences.get(
            (context, a, b), lambda: splitting.logit_difference(list(context), a, b, progress, cancelled)
        )

    def remade(self, kept: Analyses) -> Analyses:
        """The attributions and logit differences `kept` (a journey file's), computed again on this journey
        (replay --verify holds them to the model)."""
        attributions = tuple(self.attribute(a.position, a.method) for a in kept.attributions)
        splitting: LogitSplitting | None = None
        differences = []
        for d in kept.logit_differences:
            splitting = splitting or require(self.session.engine, Capability.LOGIT_SPLIT, "the logit split")
            differences.append(splitting.logit_difference(list(self._past(d.position)[0]), d.a_id, d.b_id))
        return Analyses(attributions, tuple(differences))

    def kept(self) -> Analyses:
        """The attributions and logit differences computed on the current path (a journey file keeps them)."""
        ids, differences = tuple(self.session.ids), []
        for key, difference in self._differences.items():
            context = cast(tuple[tuple[int, ...], int, int], key)[0]
            if ids[: len(context)] == context:
                differences.append(difference)
        return Analyses(tuple(self.kept_attributions()), tuple(differences))

    def kept_inspections(self) -> list[Inspection]:
        """The logit lens computed on the current path, by position (the newest where several were): what a
        page shows."""
        found = {}
        for key, inspection in self._inspections.items():
            if self._on_path(*cast(tuple[tuple[int, ...], int, object, object], key)[:2]):
                found[inspection.position] = inspection
        return [found[p] for p in sorted(found)]

    def kept_attributions(self) -> list[Attribution]:
        """The attributions computed on the current path, oldest first."""
        return [
            a
            for key, a in self._attributions.items()
            if self._on_path(*cast(tuple[tuple[int, ...], int, str], key)[:2])
        ]

    def _on_path(self, context: tuple[int, ...], chosen: int) -> bool:
        """Whether a result about `context`, followed by `chosen`, is about the current path."""
        s = self.session
        ids, n = tuple(s.ids), len(context)
        pending = s.records[-1].decision.chosen_id if s.pending is not None else None
        return ids[:n] == context and (ids[n : n + 1] == (chosen,) or (n == len(ids) and chosen == pending))

    def _past(self, position: int) -> tuple[tuple[int, ...], int]:
        """The tokens up to `position` and the token that followed it (or is pending there)."""
        s = self.session
        if not 0 <= position < s.engine.kv_len:
            raise TokenvizError(f"position {position} has not been through the model yet")
        chosen = s.ids[position + 1] if position + 1 < len(s.ids) else s.records[-1].decision.chosen_id
        return tuple(s.ids[: position + 1]), chosen
