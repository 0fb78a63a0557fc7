"""When generation stops: end of sequence, max new tokens, a stop string, a grammar complete or a full
context."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from tokenviz.contract.settings import SamplingSettings


def stop_reason(
    ids: Sequence[int],
    generated: Callable[[], str],
    prompt_len: int,
    settings: SamplingSettings,
    eos_ids: Collection[int],
    context: int,
    grammar_complete: Callable[[], bool] = lambda: False,
) -> str | None:
    """Why a journey whose tokens are `ids` must stop now, or None. `generated` decodes the generated
    text (only called when there are stop strings to look for); `grammar_complete` says whether the
    settings' grammar allows nothing more (only called when there is one)."""
    if ids[-1] in eos_ids:
        return "end of sequence"
    if len(ids) - prompt_len >= settings.max_new_tokens:
        return f"max new tokens ({settings.max_new_tokens})"
    if settings.stop:
        text = generated()
        for stop in settings.stop:
            if stop in text:
                return f"stop string {stop!r}"
    if settings.grammar is not None and grammar_complete():
        return "the grammar is complete"
    if len(ids) >= context:
        return f"context full ({context} tokens)"
    return None
