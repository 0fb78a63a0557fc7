"""Each record as a JSON document shows it: pydantic's own serialization of the contract's records (the
one a journey file holds), laid out for a reader where the file keeps rows.

A record's fields are its JSON (`as_json`: a model's description, settings, an intervention, a route,
a grammar, a speculation's round, a symptom's step): the trace document and the file write it alike. A
file keeps its many small records as rows (`[id, text, logit, prob]`) and a step's numbers where its
record holds them; a document names every value, so a reader (a person, a script) needs no schema:
those layouts are here, one function each, and nowhere else.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from tokenviz.contract.interventions import Intervention, kind_of
from tokenviz.contract.records import Candidate, Decision, PinnedToken, StepRecord, Unsteered
from tokenviz.contract.results import (
    Attribution,
    BeamResult,
    LensLayer,
    LogitDifference,
    Speculation,
    StepDiff,
    lens_row_label,
)
from tokenviz.contract.settings import SamplingSettings, SavedSettings
from tokenviz.contract.symptoms import Symptom


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def as_json(record: object, kind: object = None) -> Any:
    """`record` as pydantic serializes it (as `kind`, where not its own type): what a journey file holds."""
    return _adapter(type(record) if kind is None else kind).dump_python(record, mode="json")


def settings_json(settings: SamplingSettings) -> dict[str, Any]:
    """Settings as a file keeps them: a grammar by its kind, source and digest (`grammars_json` holds it)."""
    return dict(as_json(settings, SavedSettings))


def grammars_json(settings: Sequence[SamplingSettings]) -> dict[str, Any]:
    """Each grammar the settings use, once, by digest: what contract.settings.grammars_from_json reads."""
    return {s.grammar.digest: as_json(s.grammar) for s in settings if s.grammar is not None}


def known(value: float) -> float | None:
    """A number as strict JSON holds it: None for NaN or an infinity."""
    return value if math.isfinite(value) else None


def candidate_json(c: Candidate) -> dict[str, Any]:
    return {"id": c.id, "text": c.text, "logit": c.logit, "prob": c.prob}


def intervention_json(intervention: Intervention) -> dict[str, Any]:
    """An intervention by its kind and fields: what contract.interventions.intervention_from_json reads."""
    return {"kind": kind_of(intervention), **as_json(intervention)}


def watched_json(p: PinnedToken) -> dict[str, Any]:
    return {"id": p.id, "text": p.text, "prob": p.prob, "final_prob": p.final_prob, "rank": p.rank}


def unsteered_json(u: Unsteered) -> dict[str, Any]:
    return {
        "top": [candidate_json(c) for c in u.top],
        "kl": u.kl,
        "ms": u.ms,
        **({"kl_floor": True} if u.kl_floor else {}),
    }


def draw_json(d: Decision) -> dict[str, Any]:
    return {
        "greedy": d.greedy,
        "mode": d.mode,
        "u": d.u,
        "band": list(d.band) if d.band else None,
        "chosen_rank": d.chosen_rank,
        "raw_rank": d.raw_rank,
    }


def record_json(r: StepRecord) -> dict[str, Any]:
    """A step as its record holds it, every value named (files.documents.step_json gives it the
    document's one shape whatever the backend)."""
    d = r.decision
    return {
        "index": r.index,
        "position": r.position,
        "chosen": {"id": d.chosen_id, "text": d.chosen_text, "prob": d.final_prob},
        "top": [candidate_json(c) for c in r.top],
        "entropy": r.entropy,
        "stages": [
            {
                "name": s.name,
                "kept": s.kept,
                "mass": s.mass,
                **({"grammar": s.detail, "allowed": s.kept, "removed": s.removed} if s.is_grammar else {}),
            }
            for s in d.stages
        ],
        "draw": draw_json(d),
        "settings": settings_json(d.settings),
        "ms": {"forward": r.forward_ms, "sampling": d.ms, **({"by_place": dict(r.place_ms)} if r.place_ms else {})},
        "kv": {"len": r.kv_len, "bytes": r.kv_bytes},
        **({"watch": [watched_json(p) for p in d.pinned]} if d.pinned else {}),
        **({"interventions": [i.label for i in r.interventions]} if r.interventions else {}),
        **({"unsteered": unsteered_json(r.unsteered)} if r.unsteered else {}),
        **({"saturated": True} if r.saturated else {}),
    }


def lens_row_json(row: LensLayer) -> dict[str, Any]:
    return {
        "layer": row.layer,
        "label": lens_row_label(row.layer),
        "top": [{"id": i, "text": t, "prob": p} for i, t, p in row.top],
        "chosen_rank": row.chosen_rank,
        "chosen_prob": row.chosen_prob,
        "norm": row.residual_norm,
        "watch": [{"rank": r, "prob": p} for r, p in row.pinned],
    }


def attribution_json(a: Attribution, texts: list[str], ids: list[int]) -> list[dict[str, Any]]:
    """One entry per position: {"position", "id", "text", "score"}."""
    return [{"position": p, "id": ids[p], "text": texts[p], "score": score} for p, score in enumerate(a.scores)]


def logit_difference_json(d: LogitDifference) -> dict[str, Any]:
    return {
        "position": d.position,
        "a": {"id": d.a_id, "text": d.a_text},
        "b": {"id": d.b_id, "text": d.b_text},
        "total": d.total,
        "embedding": d.embedding,
        "layers": [{"attention": a, "mlp": m} for a, m in zip(d.attention, d.mlp)],
        "bias": d.bias,
        "softcap": d.softcap,
    }


def step_diff_json(d: StepDiff) -> dict[str, Any]:
    """Its fields, a figure not known (NaN) or infinite as null: strict JSON."""
    return {name: known(value) if isinstance(value, float) else value for name, value in as_json(d).items()}


def beams_json(result: BeamResult) -> dict[str, Any]:
    return {
        "width": result.width,
        "steps": [
            {
                "index": s.index,
                "beams": [{"ids": list(ids), "logprob": score} for ids, score in s.beams],
                "candidates": [
                    {
                        "beam": c.beam,
                        "id": c.id,
                        "text": c.text,
                        "token_logprob": c.token_logprob,
                        "logprob": c.score,
                        "fate": c.fate,
                    }
                    for c in s.candidates
                ],
            }
            for s in result.steps
        ],
        "final": [as_json(h) for h in result.final],
    }


def speculation_json(s: Speculation) -> dict[str, Any]:
    return {
        "drafter": s.drafter,
        "rounds": [
            {"drafted": list(r.drafted), "accepted": r.accepted, "next": r.next_id, "rejected_at": r.rejected_at}
            for r in s.rounds
        ],
        "acceptance_rate": s.acceptance_rate,
        "tokens_per_forward": s.tokens_per_forward,
        "target_forwards": len(s.rounds),
    }


def symptom_json(s: Symptom) -> dict[str, Any]:
    return {"symptom": s.symptom, "cause": s.cause, "evidence": as_json(s.evidence), "remedy": s.remedy}
