"""Every JSON document tokenviz prints or writes, built from plain data in one place: the trace
(`tokenviz trace --json`, and the start of a saved journey), a run that did not step a journey
(beams, speculation), a comparison and a score."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.presets import preset_in_force
from tokenviz.contract.records import ModelInfo, PromptPrediction, TokenChip
from tokenviz.contract.results import StepDiff
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text
from tokenviz.files.record_json import as_json, grammars_json, record_json, settings_json, step_diff_json

# Every key a trace document's step may have before a view adds its own (step_json, StepRecord's JSON): what
# a journey file does not keep, for its records hold it (files.journey_file).
TRACE_STEP_KEYS = frozenset(
    {"index", "position", "chosen", "top", "entropy", "entropy_floor", "stages", "draw", "settings", "ms", "kv",
     "watch", "interventions", "unsteered", "saturated"}
)  # fmt: skip


def trace_document(snapshot: Snapshot) -> dict[str, Any]:
    """The trace document: model, prompt, every committed step, the text."""
    if snapshot.info is None:
        raise TokenvizError("no journey yet: the model has not loaded")
    committed = len(snapshot.chips) - snapshot.prompt_len
    steps = [record_json(r) for r in snapshot.records[:committed]]
    return {
        "model": as_json(snapshot.info),
        "settings": settings_json(snapshot.settings),
        "preset": preset.name if (preset := preset_in_force(snapshot.settings)) else None,
        "prompt": [{"id": c.id, "text": c.text} for c in snapshot.chips[: snapshot.prompt_len]],
        "not_given": not_given(snapshot.info),
        "steps": [step_json(s, snapshot.info) for s in steps],
        "prefill_ms": snapshot.records[0].forward_ms if snapshot.records else None,
        "stop_reason": snapshot.stop_reason,
        "text": snapshot.text,
        "full_text": snapshot.full_text,
        "grammars": grammars_json([snapshot.settings, *(r.decision.settings for r in snapshot.records)]),
    }


def not_given(info: ModelInfo) -> dict[str, str]:
    """The step fields this model's backend cannot give (null in every step), each with why: the
    document has one shape whatever runs the model."""
    absent = {}
    if info.covers:
        absent["top.logit"] = f"its top {info.covers} come as log-probabilities (logprob), not logits"
        absent["entropy"] = f"over its top {info.covers} alone, the entropy is a floor (entropy_floor)"
    if info.requests:
        absent["ms.forward"] = f"a request's time, network included, is ms.request ({info.requests})"
        absent["kv"] = "a server keeps its own KV cache"
    else:
        absent["ms.request"] = "no request: the pass runs in this process (ms.forward)"
    return absent


def step_json(step: dict[str, Any], info: ModelInfo) -> dict[str, Any]:
    """A step in the document's one shape: a candidate's logit and log-probability, the entropy and its
    floor, the pass's or the request's time and the cache, null where this backend cannot give them
    (`not_given`). A top N's candidate 'logit' is the engine's log-probability."""
    top_n, requested = bool(info.covers), bool(info.requests)
    out = dict(step)
    out["top"] = [_candidate(c, top_n) for c in step["top"]]
    out["entropy"], out["entropy_floor"] = (None if top_n else step["entropy"]), step["entropy"]
    ms = dict(step["ms"])
    took = ms.pop("forward")
    out["ms"] = {"forward": None if requested else took, "request": took if requested else None, **ms}
    out["kv"] = None if requested else step["kv"]
    if "unsteered" in step:
        out["unsteered"] = {**step["unsteered"], "top": [_candidate(c, top_n) for c in step["unsteered"]["top"]]}
    return out


def _candidate(candidate: dict[str, Any], top_n: bool) -> dict[str, Any]:
    """{id, text, logit, logprob, prob}: a top N's 'logit' is its log-probability (no logit given)."""
    logit, prob = candidate["logit"], candidate["prob"]
    logprob = logit if top_n else (math.log(prob) if prob > 0 else None)
    return {**candidate, "logit": None if top_n else logit, "logprob": logprob}


def output_document(
    info: ModelInfo,
    settings: SamplingSettings,
    prompt: Sequence[tuple[int, str]],
    generated: Sequence[tuple[int, str]],
    text: str,
    full_text: str,
    **extra: Any,
) -> dict[str, Any]:
    """The trace document of a run that produced `generated` (id, piece) without stepping a journey
    (beams, speculation): `extra` holds the run's own record."""
    return {
        "model": as_json(info),
        "settings": settings_json(settings),
        "prompt": [{"id": t, "text": piece} for t, piece in prompt],
        "steps": [{"index": i, "chosen": {"id": t, "text": piece}} for i, (t, piece) in enumerate(generated)],
        **extra,
        "text": text,
        "full_text": full_text,
        "grammars": grammars_json([settings]),
    }


def interventions_in_force(s: Snapshot) -> tuple[Intervention, ...]:
    """The interventions the journey's latest step ran under (before its first, those switched on)."""
    latest = s.records[-1] if s.records else None
    return latest.interventions if latest else tuple(i for i, on in s.interventions if on)


def setup(s: Snapshot) -> dict[str, str]:
    """What a journey runs on and by, field by field, as a comparison's headers show it: the model, the
    runtime that runs it, how its weights are held, the grammar, the interventions, then every sampling
    setting."""
    info, settings = s.info, s.settings
    interventions = interventions_in_force(s)
    fields = {
        "model": info.name if info else "?",
        "runtime": (info.runtime if info else "") or "?",
        "attention": (info.attention if info else "") or "?",
        "dtype": info.dtype if info else "?",
        "quantization": (info.quantization if info else "") or "none",
        "vocabulary": f"{info.vocab:,}" if info else "?",
        "grammar": settings.grammar.label if settings.grammar else "none",
        "interventions": ", ".join(i.label for i in interventions) or "none",
        "preset": preset.name if (preset := preset_in_force(settings)) else "none",
        "sampling": "greedy" if settings.greedy else f"T {settings.temperature:g}",
        "top-k": str(settings.top_k) if settings.top_k else "off",
        "top-p": f"{settings.top_p:g}",
        "min-p": f"{settings.min_p:g}",
        "repetition": f"×{settings.repetition_penalty:g}",
        "presence/frequency": f"{settings.presence_penalty:g}/{settings.frequency_penalty:g}",
        "seed": str(settings.seed),
        "max new tokens": str(settings.max_new_tokens),
        "stop": ", ".join(repr(stop) for stop in settings.stop) or "none",
    }
    return {name: safe_text(value) for name, value in fields.items()}


def setup_differences(a: Snapshot, b: Snapshot) -> dict[str, tuple[str, str]]:
    """Every field of `setup` where the two journeys differ: (A's, B's)."""
    sa, sb = setup(a), setup(b)
    return {name: (sa[name], sb[name]) for name in sa if sa[name] != sb[name]}


def comparison_document(
    a: Snapshot,
    b: Snapshot,
    diffs: Sequence[StepDiff],
    kl_over: str = "",
    independent_draws: bool = False,
    statistics: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Both journeys as trace documents, with what sets them apart ("differences": A's and B's value of
    every field that differs), their differences over the steps both have taken and the first of
    them where their chosen tokens part; `kl_over`, where the KL is not over the whole vocabulary;
    whether each side draws on its own (a served B: a parting may be two draws, not two models); the
    steps' `statistics` in llama-perplexity's terms, B the base (journey.comparison.journey_statistics)."""
    da, db = trace_document(a), trace_document(b)
    both = min(len(da["steps"]), len(db["steps"]))
    parted = next(
        (
            ra.index
            for ra, rb in zip(a.records[:both], b.records[:both])
            if ra.decision.chosen_id != rb.decision.chosen_id
        ),
        None,
    )
    differences = {name: list(values) for name, values in setup_differences(a, b).items()}
    return {
        "a": da,
        "b": db,
        "differences": differences,
        "diff": [step_diff_json(d) for d in diffs[:both]],
        "parted_at": parted,
        **({"kl_over": kl_over} if kl_over else {}),
        "independent_draws": independent_draws,
        "statistics": dict(statistics) if statistics is not None else None,
    }


def score_document(
    info: ModelInfo, chips: Sequence[TokenChip], predictions: Sequence[PromptPrediction]
) -> dict[str, Any]:
    """How likely the model found each token of a text after the first (read, never predicted):
    its log-probability, probability, rank, the entropy and top candidates there; the total and the
    perplexity of the text's own tokens. A chat template's tokens are listed (marked "template") but
    counted apart: they say how the template reads, not how likely the text is. Over a top N (a
    server's: see decoding.drawn) the entropy is only a floor: `entropy` is null, `entropy_floor` given."""
    tokens = [
        {
            "index": p.position + 1,
            "id": p.next_id,
            "text": p.next_text,
            "logprob": p.logprob,
            "prob": p.next_prob,
            "rank": p.next_rank,
            "entropy": None if info.covers else p.entropy,  # (a top N's: its floor alone)
            "entropy_floor": p.entropy,
            "top": [{"id": c.id, "text": c.text, "prob": c.prob} for c in p.top],
            **({"template": True} if chips[p.position + 1].is_template else {}),
        }
        for p in predictions
    ]
    own = [p for p in predictions if not chips[p.position + 1].is_template]
    template = [p for p in predictions if chips[p.position + 1].is_template]
    total = sum(p.logprob for p in own)
    return {
        "model": as_json(info),
        "not_given": {field: why for field, why in not_given(info).items() if field == "entropy"},
        "first": {"id": chips[0].id, "text": chips[0].text},
        "tokens": tokens,
        "scored": len(own),  # the text's own tokens: the total and the perplexity are theirs
        "logprob": total,
        "perplexity": math.exp(-total / len(own)) if own else None,
        "template": {"tokens": len(template), "logprob": sum(p.logprob for p in template)},
    }
