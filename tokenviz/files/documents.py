"""Every JSON document tokenviz prints or writes, built from plain data in one place: the trace
(`tokenviz trace --json`, and the start of a saved journey), a run that did not step a journey
(beams, speculation), a comparison and a score."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.presets import preset_in_force
from tokenviz.contract.records import ModelInfo, PromptPrediction, TokenChip
from tokenviz.contract.results import StepDiff
from tokenviz.contract.settings import SamplingSettings, grammars_json
from tokenviz.contract.snapshot import Snapshot
from tokenviz.contract.text import safe_text


def trace_document(snapshot: Snapshot) -> dict[str, Any]:
    """The trace document: model, prompt, every committed step, the text."""
    if snapshot.info is None:
        raise TokenvizError("no journey yet: the model has not loaded")
    committed = len(snapshot.chips) - snapshot.prompt_len
    steps = [r.to_json() for r in snapshot.records[:committed]]
    return {
        "model": snapshot.info.to_json(),
        "settings": snapshot.settings.to_json(),
        "preset": preset.name if (preset := preset_in_force(snapshot.settings)) else None,
        "prompt": [{"id": c.id, "text": c.text} for c in snapshot.chips[: snapshot.prompt_len]],
        "steps": [served_step(s) for s in steps] if snapshot.info.covers else steps,
        "prefill_ms": snapshot.records[0].forward_ms if snapshot.records else None,
        "stop_reason": snapshot.stop_reason,
        "text": snapshot.text,
        "full_text": snapshot.full_text,
        "grammars": grammars_json([snapshot.settings, *(r.decision.settings for r in snapshot.records)]),
    }


def served_step(step: dict[str, Any]) -> dict[str, Any]:
    """A step of a served model named for what the server gives:
    log-probabilities (not logits), the entropy's floor, a request's time (not a forward pass), and no KV
    cache (the server keeps its own)."""
    out = {k: v for k, v in step.items() if k != "kv"}
    out["top"] = [_logprob(c) for c in step["top"]]
    out["entropy_floor"] = out.pop("entropy")
    out["ms"] = {("request" if k == "forward" else k): v for k, v in step["ms"].items()}
    if "unsteered" in step:
        out["unsteered"] = {**step["unsteered"], "top": [_logprob(c) for c in step["unsteered"]["top"]]}
    return out


def _logprob(candidate: dict[str, Any]) -> dict[str, Any]:
    """A served candidate: its 'logit' is the server's log-probability."""
    return {("logprob" if k == "logit" else k): v for k, v in candidate.items()}


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
        "model": info.to_json(),
        "settings": settings.to_json(),
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
    """What a journey runs on and by, field by field, as a comparison's headers show it: the model,
    how its weights are held, the grammar, the interventions, then every sampling setting."""
    info, settings = s.info, s.settings
    interventions = interventions_in_force(s)
    fields = {
        "model": info.name if info else "?",
        "dtype": info.dtype if info else "?",
        "quantization": (info.quantization if info else "") or "none",
        "vocabulary": f"{info.vocab:,}" if info else "?",
        "grammar": settings.grammar.label if settings.grammar else "none",
        "interventions": ", ".join(i.label for i in interventions) or "none",
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
    a: Snapshot, b: Snapshot, diffs: Sequence[StepDiff], kl_over: str = "", independent_draws: bool = False
) -> dict[str, Any]:
    """Both journeys as trace documents, with what sets them apart ("differences": A's and B's value of
    every field that differs), their differences over the steps both have taken and the first of
    them where their chosen tokens part; `kl_over`, where the KL is not over the whole vocabulary;
    whether each side draws on its own (a served B: a parting may be two draws, not two models)."""
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
        "diff": [d.to_json() for d in diffs[:both]],
        "parted_at": parted,
        **({"kl_over": kl_over} if kl_over else {}),
        "independent_draws": independent_draws,
    }


def score_document(
    info: ModelInfo, chips: Sequence[TokenChip], predictions: Sequence[PromptPrediction]
) -> dict[str, Any]:
    """How likely the model found each token of a text after the first (read, never predicted):
    its log-probability, probability, rank, the entropy and top candidates there; the total and the
    perplexity of the text's own tokens. A chat template's tokens are listed (marked "template") but
    counted apart: they say how the template reads, not how likely the text is. A served model's
    entropy is a floor (its server gives a top-N: see decoding.drawn), named so."""
    entropy = "entropy_floor" if info.covers else "entropy"
    tokens = [
        {
            "index": p.position + 1,
            "id": p.next_id,
            "text": p.next_text,
            "logprob": p.logprob,
            "prob": p.next_prob,
            "rank": p.next_rank,
            entropy: p.entropy,
            "top": [{"id": c.id, "text": c.text, "prob": c.prob} for c in p.top],
            **({"template": True} if chips[p.position + 1].is_template else {}),
        }
        for p in predictions
    ]
    own = [p for p in predictions if not chips[p.position + 1].is_template]
    template = [p for p in predictions if chips[p.position + 1].is_template]
    total = sum(p.logprob for p in own)
    return {
        "model": info.to_json(),
        "first": {"id": chips[0].id, "text": chips[0].text},
        "tokens": tokens,
        "scored": len(own),  # the text's own tokens: the total and the perplexity are theirs
        "logprob": total,
        "perplexity": math.exp(-total / len(own)) if own else None,
        "template": {"tokens": len(template), "logprob": sum(p.logprob for p in template)},
    }
