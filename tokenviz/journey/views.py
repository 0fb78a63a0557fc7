"""The views computed on demand, one spec each: the request that asks for it, the engine capability it
needs, its progress line, how it is computed from a session, and its entry in the trace document.

The app's worker (tokenviz.worker.engine_thread), `tokenviz trace` (tokenviz.cli.headless) and the bench all
compute a view through its spec, so a view is computed one way: a new view is one spec and one pane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokenviz.contract.commands import (
    Attribute,
    Beams,
    Inspect,
    LabelFeatures,
    ReadFeatures,
    Request,
    Speculate,
    SplitDifference,
    Verify,
)
from tokenviz.contract.engine import Caching, Capability, SearchAsk, refusal_of, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.features import FeatureLabels, FeatureReadings
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.results import Attribution, Inspection, LogitDifference, ViewResult
from tokenviz.files.record_json import as_json, attribution_json, lens_row_json, logit_difference_json
from tokenviz.journey.chips import chips_of
from tokenviz.journey.feature_readings import features_at, labels_for
from tokenviz.journey.session import Session
from tokenviz.journey.verification import verify_latest

Progress = Callable[[int, int], None]  # (done, total)
Cancelled = Callable[[], bool]


@dataclass(frozen=True)
class ViewSpec:
    """One view's computation. `job` is its progress line while it runs ('' for a quick one);
    `trace` writes its result into a trace step (for the views computed at every step's position)."""

    name: str  # how a refusal names it
    needs: Capability
    job: Callable[[Any], str]
    unit: str
    compute: Callable[[Session, Any, Progress, Cancelled], ViewResult]
    trace: Callable[[Session, Any], dict[str, Any]] | None = None


def _inspect(session: Session, request: Inspect, progress: Progress, cancelled: Cancelled) -> Inspection:
    return session.analyses.inspect(request.position, request.rows)


def _lens_entry(session: Session, inspection: Inspection) -> dict[str, Any]:
    return {
        "lens": [lens_row_json(row) for row in inspection.lens],
        "lens_first_top1_layer": inspection.first_top1_layer,
    }


def _attribute(session: Session, request: Attribute, progress: Progress, cancelled: Cancelled) -> Attribution:
    line = (
        refusal_of(session.engine.info, Capability.ATTRIBUTION, "gradient × input")
        if request.method == "grad"
        else None
    )
    if line is not None:  # leave-one-out needs less: the spec's capability
        raise TokenvizError(line)
    return session.analyses.attribute(request.position, request.method, progress, cancelled)


def _attribution_entry(session: Session, attribution: Attribution) -> dict[str, Any]:
    chips = chips_of(session)
    return {"attribution": attribution_json(attribution, [c.text for c in chips], [c.id for c in chips])}


def _split(session: Session, request: SplitDifference, progress: Progress, cancelled: Cancelled) -> LogitDifference:
    return session.analyses.logit_difference(request.position, progress, cancelled)


def _features(session: Session, request: ReadFeatures, progress: Progress, cancelled: Cancelled) -> FeatureReadings:
    return features_at(session, request.position)


def _labels(session: Session, request: LabelFeatures, progress: Progress, cancelled: Cancelled) -> FeatureLabels:
    return labels_for(session, request.features)


def _verify(session: Session, request: Verify, progress: Progress, cancelled: Cancelled) -> ViewResult:
    return verify_latest(session.engine, session.cached_ids, progress, cancelled)


def _search(session: Session, steps: int, progress: Progress, cancelled: Cancelled) -> SearchAsk:
    """A search from the journey as it is, its cache the start."""
    return SearchAsk(tuple(session.ids), steps, from_cache=True, cancelled=cancelled, progress=progress)


def _beams(session: Session, request: Beams, progress: Progress, cancelled: Cancelled) -> ViewResult:
    refuse_grammar(session.settings.grammar, "beam search")
    cache: Caching = require(session.engine, Capability.CACHE, "beam search")
    return cache.beam_search(_search(session, request.steps, progress, cancelled), request.width)


def _speculate(session: Session, request: Speculate, progress: Progress, cancelled: Cancelled) -> ViewResult:
    cache: Caching = require(session.engine, Capability.CACHE, "speculative decoding")
    return cache.speculate(_search(session, request.steps, progress, cancelled), request.drafter, session.settings)


VIEWS: dict[type[Request[Any]], ViewSpec] = {
    Inspect: ViewSpec("the logit lens", Capability.LENS, lambda r: "", "", _inspect, _lens_entry),
    Attribute: ViewSpec(
        "attribution",
        Capability.LEAVE_ONE_OUT,
        lambda r: (
            "leaving out each token (a pass, or a request, each)"
            if r.method == "loo"
            else "gradient × input: layer by layer"
        ),
        "",
        _attribute,
        _attribution_entry,
    ),
    SplitDifference: ViewSpec(
        "the logit split",
        Capability.LOGIT_SPLIT,
        lambda r: "splitting the logit difference: layer",
        "",
        _split,
        lambda session, difference: {"logit_difference": logit_difference_json(difference)},
    ),
    ReadFeatures: ViewSpec(
        "an SAE's features",
        Capability.RESIDUAL,
        lambda r: "",
        "",
        _features,
        lambda session, read: {"sae": [as_json(reading) for reading in read.readings]},
    ),
    LabelFeatures: ViewSpec("a feature's label", Capability.RESIDUAL, lambda r: "", "", _labels),
    Verify: ViewSpec(
        "verify", Capability.CACHE, lambda r: "verifying: the context again without the cache", " tokens", _verify
    ),
    Beams: ViewSpec("beam search", Capability.CACHE, lambda r: "beam search: step", "", _beams),
    Speculate: ViewSpec("speculative decoding", Capability.CACHE, lambda r: "speculating", " tokens", _speculate),
}


def spec_of(session: Session, request: Request[Any]) -> ViewSpec:
    """The spec that computes `request`, refused in one line where the engine lacks what it needs."""
    spec = VIEWS.get(type(request))
    if spec is None:
        raise TokenvizError(f"unknown request {request!r}")
    line = refusal_of(session.engine.info, spec.needs, spec.name)
    if line is not None:
        raise TokenvizError(line)
    return spec


def compute(
    session: Session,
    request: Request[Any],
    progress: Progress = lambda done, total: None,
    cancelled: Cancelled = lambda: False,
) -> ViewResult:
    """`request`'s result on the journey as it is now."""
    return spec_of(session, request).compute(session, request, progress, cancelled)


def trace_entry(session: Session, request: Request[Any]) -> dict[str, Any]:
    """`request`'s result as its entry in a trace step (the same computation as the app's)."""
    spec = spec_of(session, request)
    assert spec.trace is not None, f"{spec.name} has no trace entry"
    return spec.trace(session, spec.compute(session, request, lambda done, total: None, lambda: False))
