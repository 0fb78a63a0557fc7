"""The headless journey (`tokenviz trace`): load, prefill, step until done, as one JSON-ready document."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenviz.cli.backend_options import BackendChoice
from tokenviz.cli.commands.common import StepViews
from tokenviz.contract.backend import OpenEngine, Progress
from tokenviz.contract.commands import Attribute, Beams, Inspect, Request, SplitDifference
from tokenviz.contract.engine import Caching, Capability, DrawingEngine, Engine, SearchAsk, refusal_of, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.lens_layers import LensLayers
from tokenviz.contract.results import AttributionMethod, BeamResult
from tokenviz.contract.settings import SamplingSettings
from tokenviz.features.feature_edits import with_sae
from tokenviz.features.sae_folder import read_saes
from tokenviz.features.sparse_autoencoder import SparseAutoencoder, sae_named
from tokenviz.files.documents import comparison_document, output_document, trace_document
from tokenviz.files.journey_file import journey_file, recording_of, save_journey
from tokenviz.files.journey_page import page_features, save_page
from tokenviz.files.record_json import as_json, beams_json, speculation_json, symptom_json
from tokenviz.journey.comparison import Comparison
from tokenviz.journey.drawn_comparison import DrawnComparison
from tokenviz.journey.feature_readings import (
    check_saes,
    feature_moves,
    labels_of,
    readings_of,
    residuals_at,
    watched_of,
)
from tokenviz.journey.past_results import KEEP
from tokenviz.journey.prompt import tokenize
from tokenviz.journey.session import Session
from tokenviz.journey.views import compute, trace_entry
from tokenviz.journey.watching import token_of
from tokenviz.worker.snapshots import saved_attention_of, snapshot_of, symptoms


class SaveFailed(TokenvizError):
    """The run worked but its journey could not be saved: the document is still there to print."""

    def __init__(self, message: str, document: dict[str, Any]):
        super().__init__(message)
        self.document = document


def journey_document(session: Session) -> dict[str, Any]:
    """The trace document, with the diagnosis of its text (journey.diagnosis)."""
    found = symptoms(session)  # once, for the document and its snapshot
    document = trace_document(snapshot_of(session, found=found))
    document["diagnosis"] = [symptom_json(s) for s in found]
    return document


def add_step_views(
    session: Session,
    document: dict[str, Any],
    request_at: Callable[[int], Request[Any]],
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> None:
    """Each step gains the view `request_at(position)` asks for at the position whose forward pass
    gave its distribution (the last prompt token's for step 0), computed as the app computes it;
    `progress(done, total)` before each step's."""
    first, steps = len(session.prompt_ids) - 1, document["steps"]
    for i, step in enumerate(steps):
        progress(i, len(steps))
        step.update(trace_entry(session, request_at(first + i)))


def add_lens(session: Session, document: dict[str, Any]) -> None:
    """Each step gains its logit lens: one entry per layer (0 = the embeddings), the last being
    the model's own output. One forward pass serves every batch of steps."""
    first, steps = len(session.prompt_ids) - 1, len(document["steps"])
    for begin in range(0, steps, KEEP):
        session.analyses.inspect_many([first + i for i in range(begin, min(begin + KEEP, steps))])
        for i in range(begin, min(begin + KEEP, steps)):
            document["steps"][i].update(trace_entry(session, Inspect(first + i)))


def check_views(
    session: Session,
    lens: bool,
    attention: int | None,
    interventions: Sequence[Intervention] = (),
    routing: bool = False,
    searched: str = "",
) -> None:
    """Refuse, before the journey runs, a view, intervention or search (`searched`: --beams or
    --speculate) its engine cannot give: one line saying what it lacks."""
    info = session.engine.info
    for asked, needs, option in (
        (lens, Capability.LENS, "--lens"),
        (attention is not None, Capability.ATTENTION, "--attention"),
        (bool(interventions), Capability.INTERVENTIONS, interventions[0].label if interventions else ""),
        (routing, Capability.ROUTING, "--routing"),
        (bool(searched), Capability.CACHE, searched),
    ):
        line = refusal_of(info, needs, option) if asked else None
        if line is not None:
            raise TokenvizError(line)
    if attention is not None and not 0 <= attention < info.layers:
        raise TokenvizError(f"--attention {attention}: {info.name}'s layers are 0 to {info.layers - 1}")


def add_attention(session: Session, document: dict[str, Any], layer: int) -> None:
    """Each step gains the attention row of the position whose pass gave its distribution (the last
    prompt token's for step 0) at `layer`: every head's weights over that position and those before."""
    first, steps = len(session.prompt_ids) - 1, len(document["steps"])
    if not steps:
        return
    rows = session.attention(range(first, first + steps), [layer])[0]  # (heads, steps, keys)
    for i, step in enumerate(document["steps"]):
        step["attention"] = {"layer": layer, "heads": rows[:, i, : first + i + 1].tolist()}


def add_views(
    session: Session,
    document: dict[str, Any],
    lens: bool,
    routing: bool,
    differences: bool,
    attribution: AttributionMethod | None,
    progress: Progress,
) -> None:
    """What the trace's options add to each step, once the journey has run."""
    if lens:
        add_lens(session, document)
    if routing:
        add_routing(session, document)
    if differences:
        add_step_views(session, document, SplitDifference)
    if attribution:
        add_step_views(
            session,
            document,
            lambda position: Attribute(position, attribution),
            lambda done, total: progress(f"attribution ({attribution}): step {done + 1} of {total}", done / total),
        )


def add_routing(session: Session, document: dict[str, Any]) -> None:
    """Each step gains the routing of the token whose forward pass gave its distribution (the last
    prompt token for step 0); the document, every prompt position's under "prompt_routing"."""
    for step, record in zip(document["steps"], session.records):
        step["routing"] = [as_json(route) for route in record.routing.at(-1)] if record.routing else []
    first = session.records[0].routing if session.records else None
    positions = range(first.positions) if first else range(0)
    document["prompt_routing"] = [[as_json(route) for route in first.at(i)] for i in positions] if first else []


def add_features(
    session: Session,
    document: dict[str, Any],
    saes: Sequence[SparseAutoencoder],
    folders: Sequence[str],
    progress: Progress,
    watched: Sequence[tuple[str, int]] = (),
) -> None:
    """Each step gains every SAE's reading of the residual at the position whose pass gave its distribution
    (the last prompt token's for step 0): its active features, strongest first, their shares, L0 and error;
    and each `watched` feature's activation there (`watched_features`). Each feature on at some step is
    labelled once (`sae_labels`: the tokens it promotes and suppresses most). The document names the `folders`
    they were read from (`sae_folders`: replay --verify reads them again)."""
    first, steps = len(session.prompt_ids) - 1, document["steps"]
    document["sae_folders"] = [str(Path(folder).expanduser().resolve()) for folder in folders]
    if not steps:
        return
    progress(f"the SAEs' features at {len(steps)} steps", None)
    positions = [first + i for i in range(len(steps))]
    residuals = residuals_at(session.engine, session.ids, positions, (sae.layer for sae in saes))  # read once
    every = readings_of(residuals, positions, saes)
    for step, readings in zip(steps, every):
        step["sae"] = [as_json(reading) for reading in readings]
    document["sae_labels"] = [  # each feature on at some step, labelled once
        as_json(label)
        for k, sae in enumerate(saes)
        for label in labels_of(session, sae, sorted({f.id for readings in every for f in readings[k].features}))
    ]
    followed = watched_of(residuals, positions, saes, watched)
    for i, step in enumerate(steps if followed else ()):
        step["watched_features"] = [{"sae": w.sae, "id": w.id, "activation": w.activations[i]} for w in followed]


def add_feature_moves(
    comparison: Comparison, document: dict[str, Any], saes: Sequence[SparseAutoencoder], progress: Progress
) -> None:
    """Each of A's steps gains, per SAE, the features whose activations differ most between A's residual and
    B's at the position that made it, both read on A's tokens (`sae_moves`)."""
    a, b = comparison.sessions
    for session in (a, b):
        check_saes(session.engine, saes)
    first, steps = len(a.prompt_ids) - 1, document["a"]["steps"]
    positions = [first + i for i in range(len(steps))]
    progress(f"the features A and B read apart at {len(steps)} steps", None)
    moves = feature_moves(a.engine, b.engine, a.ids, positions, saes) if positions else []
    document["sae_moves"] = [[as_json(m) for m in step] for step in moves]


def saes_in(folders: Sequence[str]) -> list[SparseAutoencoder]:
    """Every SAE in `folders`, in their order (a sparsify checkpoint is one per hook point)."""
    return [sae for folder in folders for sae in read_saes(folder)]


def run_output(session: Session, prompt_ids: list[int], generated: list[int], **extra: Any) -> dict[str, Any]:
    """The trace document of a run that produced `generated` without stepping the journey."""
    engine = session.engine
    return output_document(
        engine.info,
        session.settings,
        [(t, engine.piece(t)) for t in prompt_ids],
        [(t, engine.piece(t)) for t in generated],
        engine.decode(generated),
        engine.decode(prompt_ids + generated),
        **extra,
    )


def beam_document(session: Session, ids: list[int], width: int, steps: int) -> dict[str, Any]:
    """The trace document of a beam search from the prefilled prompt (as the app's B runs it):
    "beams" holds every step; "text" is the best beam."""
    result = compute(session, Beams(width, steps))
    assert isinstance(result, BeamResult)
    return run_output(session, ids, list(result.final[0].ids), beams=beams_json(result))


def speculation_document(session: Session, ids: list[int], spec: str, draft: Engine | None) -> dict[str, Any]:
    """The trace document of speculative decoding: the steps are the output tokens."""
    cache: Caching = require(session.engine, Capability.CACHE, "--speculate")
    result = cache.speculate(SearchAsk(tuple(ids), session.settings.max_new_tokens), spec, session.settings, draft)
    return run_output(session, ids, list(result.ids), speculation=speculation_json(result))


def run_session(
    session: Session,
    prompt: str,
    progress: Progress = lambda message, fraction: None,
    chat: bool = False,
    system: str | None = None,
    defer_predictions: bool = False,
) -> Session:
    """Prefill (reporting its progress) and step until a stop condition (max new tokens bounds it).
    With `defer_predictions`, the model's prediction at every prompt position is left unmade (see
    Session.start) until `session.score_prompt()`."""
    session.start(
        prompt,
        lambda done, total: progress(f"prefilling the prompt: {done} of {total} tokens", done / total),
        chat=chat,
        system=system,
        defer_predictions=defer_predictions,
    )
    limit = session.settings.max_new_tokens
    while session.step() is not None:
        steps = len(session.generated_ids)
        progress(f"stepping: {steps} of at most {limit} tokens", min(steps / limit, 1.0))
    return session


@dataclass(frozen=True)
class TraceRequest:
    """What `tokenviz trace` asks, as one value from its command line to its run: the journey (its
    prompt, settings and chat), what each step adds (the lens of `lens_layers`, routing, attribution, the
    watched tokens, an attention row), the interventions in force from the prompt on (a mean ablation's
    mean is over the prompt), a search run instead of the journey (beams, speculation), and the files it
    writes (`save`, the `html` page with its colours, over files there with `force`)."""

    prompt: str
    settings: SamplingSettings
    chat: bool = False
    system: str | None = None
    views: StepViews = field(default_factory=StepViews)  # what each step gains: the lens, routing, SAE features...
    lens_layers: LensLayers | None = None
    interventions: tuple[Intervention, ...] = ()
    beams: int | None = None
    speculate: str | None = None
    save: str | None = None
    html: tuple[str, Iterable[tuple[str, Any]]] | None = None
    force: bool = False


def run_trace(
    asked: TraceRequest,
    loader: OpenEngine,
    draft: OpenEngine | None = None,
    progress: Progress = lambda message, fraction: None,
    written: list[tuple[str, Path]] | None = None,
) -> dict[str, Any]:
    """The journey's document; with `save` and `html` also its files, each noted in `written` as
    (what it is, where). `loader` makes the engine, `draft` a draft model's (for `speculate`)."""
    noted = [] if written is None else written
    prompt, settings, chat, system = asked.prompt, asked.settings, asked.chat, asked.system
    views = asked.views
    saes = saes_in(views.sae)  # before the model: a bad one is told now
    for name, feature in views.watched_features:
        sae_named(saes, name, feature)
    interventions = [with_sae(i, saes) for i in asked.interventions]  # a feature's: its SAE's layer
    session = Session(loader(progress), settings)
    check_saes(session.engine, saes)
    searched = "--beams" if asked.beams else "--speculate" if asked.speculate else ""
    check_views(session, views.lens, views.attention, interventions, views.routing, searched)
    session.analyses.lens_layers = asked.lens_layers
    session.analyses.lens_rows()  # a layer the model lacks is refused before the journey runs
    if interventions:
        session.set_interventions(interventions, context=tokenize(session.engine, prompt, chat, system)[1])
    if asked.beams:
        refuse_grammar(settings.grammar, "beam search")  # before the prefill
        session.start(prompt, chat=chat, system=system)
        return beam_document(session, session.prompt_ids, asked.beams, settings.max_new_tokens)
    if asked.speculate:  # it runs on its own cache: no prefill here
        _, ids, _ = tokenize(session.engine, prompt, chat, system)
        return speculation_document(session, ids, asked.speculate, None if draft is None else draft(progress))
    if views.routing and not session.engine.info.experts:
        name = session.engine.info.name
        raise TokenvizError(f"{name} has no mixture-of-experts layers: --routing has nothing to show")
    session.pin([token_of(session.engine, token) for token in views.watched_tokens])
    # The document holds no prediction at a prompt position; a saved journey and a page show them.
    document = journey_document(run_session(session, prompt, progress, chat, system, defer_predictions=True))
    add_views(session, document, views.lens, views.routing, len(views.watched_tokens) >= 2, views.attribution, progress)
    if views.attention is not None:
        add_attention(session, document, views.attention)
    if saes:
        add_features(session, document, saes, views.sae, progress, views.watched_features)
    if asked.html or asked.save:
        write_files(session, document, asked, noted)
    return document


def write_files(session: Session, document: dict[str, Any], asked: TraceRequest, noted: list[tuple[str, Path]]) -> None:
    """The trace's page and journey file, as `asked`; each noted as (what it is, where)."""
    session.score_prompt()
    snapshot, saved = snapshot_of(session), saved_attention_of(session)  # every layer's rows: once for both
    try:
        if asked.html:
            lens = session.analyses.kept_inspections()
            features = page_features(document)
            page = save_page(
                asked.html[0], snapshot, saved, asked.html[1], replace=asked.force, lens=lens, features=features
            )
            noted.append(("the page: open it in any browser", page))
        if asked.save:
            kept = session.analyses.kept()
            journey = save_journey(asked.save, snapshot, saved, kept, document=document, replace=asked.force)
            noted.append((f"the journey: tokenviz replay {journey}", journey))
    except TokenvizError as exc:
        raise SaveFailed(str(exc), document) from None


def remade_journey(recorded: dict[str, Any], session: Session) -> dict[str, Any]:
    """The journey file of `session`, which has re-run the `recorded` journey file's steps
    (journey.reproduce.verify_journey), saved as the recording was: the views its steps hold (the
    lens, an attention row, routing, the watched tokens' split, attribution, an SAE's features) made again
    the same way, the prompt's predictions made, what is in force set back to what the recording ends with."""
    steps = [s for s in recorded.get("step_views", ()) if isinstance(s, dict)]  # a file as read_journey gives it
    held = {key for step in steps for key in step}
    document = journey_document(session)
    _, kept_rows, kept = recording_of(recorded)
    methods = [a.method for a in kept.attributions] if "attribution" in held else []
    attribution = methods[0] if methods else None  # a step's entry does not name its method: the file's do
    lens = next((s["lens"] for s in steps if isinstance(s.get("lens"), list)), None)
    numbers = [row.get("layer") for row in lens or () if isinstance(row, dict)]
    rows = sorted({n for n in numbers if type(n) is int and 0 <= n <= session.engine.info.layers})
    if rows and len(rows) == len(numbers):
        session.analyses.lens_layers = LensLayers.of_rows(rows)  # the rows the recording's lens holds
    add_views(
        session,
        document,
        "lens" in held,
        "routing" in held,
        "logit_difference" in held,
        attribution,
        lambda message, fraction: None,
    )
    layer = next((s["attention"].get("layer") for s in steps if isinstance(s.get("attention"), dict)), None)
    if isinstance(layer, int):
        add_attention(session, document, layer)
    if "sae" in held:  # read again from the folders the trace named (a file keeps their readings, not them)
        folders = recorded.get("sae_folders")
        if not (isinstance(folders, list) and folders and all(isinstance(f, str) for f in folders)):
            raise TokenvizError("the journey holds SAE features but names no SAE folder to read them again with")
        saes = saes_in(folders)
        check_saes(session.engine, saes)
        lists = [s["watched_features"] for s in steps if isinstance(s.get("watched_features"), list)]
        entries: list[object] = lists[0] if lists else []
        watched = [
            (w["sae"], w["id"])
            for w in entries
            if isinstance(w, dict) and isinstance(w.get("sae"), str) and type(w.get("id")) is int
        ]
        add_features(session, document, saes, folders, lambda message, fraction: None, watched)
    session.score_prompt()
    analyses = session.analyses.remade(kept)
    remade = journey_file(snapshot_of(session), saved_attention_of(session, sorted(kept_rows.rows)), analyses, document)
    if "diagnosis" not in recorded:  # a journey the app saved holds none: its why view measures it when shown
        remade.pop("diagnosis", None)
    return dict(json.loads(json.dumps(remade)))  # as a file holds it: lists, not tuples


def compare_opener(
    settings: SamplingSettings,
    against: SamplingSettings,
    sides: tuple[BackendChoice, BackendChoice],
) -> Callable[[Progress], Comparison]:
    """What opens journeys A and B in a worker's thread, both sides' options checked now (a server asked
    whether it answers): each side's model and backend options are `sides` (BackendChoice.sides: B's
    backend is A's unless --against-backend names another, its model and options A's unless another is
    asked for). One backend and one model: B is
    A's twin (the weights shared). An engine that draws its own tokens (a server's) goes on B, compared
    over the top N it returns (DrawnComparison)."""
    a_side, b_side = sides
    a_backend = a_side.backend()
    if a_backend.draws:
        raise TokenvizError(
            f"compare draws A's tokens here, and the {a_backend.name} backend draws its own: its options are B's "
            f"(add --against-backend {a_backend.name})"
        )
    open_a = a_side.loader(settings)  # what each side was given checked first
    same = b_side.values == a_side.values
    if same and against == settings:
        raise TokenvizError(
            "compare needs the two journeys to differ: --against NAME=VALUE (a sampling setting), "
            "--against-option NAME=VALUE (a backend's option), --against-model or --against-backend"
        )
    open_b = None if same else b_side.loader(against)

    def build(progress: Progress) -> Comparison:
        a_engine = open_a(progress)
        b_engine = a_engine.twin() if open_b is None else open_b(progress)
        a, b = Session(a_engine, settings), Session(b_engine, against)
        return DrawnComparison(a, b) if isinstance(b_engine, DrawingEngine) else Comparison(a, b)

    return build


def compare_document(
    comparison: Comparison,
    prompt: str,
    chat: bool = False,
    system: str | None = None,
    progress: Progress = lambda message, fraction: None,
) -> dict[str, Any]:
    """Both journeys stepped together until both stop, as one document with their differences."""
    comparison.start(prompt, chat=chat, system=system)
    limit = max(s.settings.max_new_tokens for s in comparison.sessions)
    while comparison.step():
        steps = max(len(s.generated_ids) for s in comparison.sessions)
        progress(f"stepping both: {steps} of at most {limit} tokens", min(steps / limit, 1.0))
    a, b = (snapshot_of(s) for s in comparison.sessions)
    return comparison_document(
        a, b, comparison.diffs, comparison.kl_over, comparison.independent_draws, comparison.statistics
    )
