"""When generation stops: end of sequence, max new tokens, a stop string, a grammar complete or a full
context."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from tokenviz.contract.settings import SamplingSettings


class StopSearch:
    """The generated text searched for stop strings as it grows: each time only the text that is new since
    the last search (with the few characters before it where a stop string may begin), when the stop
    strings and the text before it are the same as then; else all of it."""

    def __init__(self) -> None:
        self._stops: tuple[str, ...] = ()
        self._text = ""  # the text searched last, where no stop string was

    def first(self, stops: Sequence[str], text: str) -> str | None:
        """The first of `stops`, in their order, that `text` holds; None if none does."""
        start = 0
        if tuple(stops) == self._stops and text.startswith(self._text):
            start = max(len(self._text) - max(map(len, stops), default=0) + 1, 0)
        new = text[start:]
        found = next((stop for stop in stops if stop in new), None)
        self._stops, self._text = tuple(stops), "" if found is not None else text  # found: asked again whole
        return found


GOING_ON = (  # how a journey stopped for each reason goes on (stop_reason's words, by how they begin)
    ("end of sequence", "rewind (backspace), or take another token at a step (a number key)"),
    ("max new tokens", "rewind, or raise the limit (max_new_tokens)"),
    ("stop string", "rewind, or clear the stop strings"),
    ("the grammar is complete", "rewind, or clear the grammar"),
    ("context full", "rewind: the model reads no more"),
)


def how_to_go_on(reason: str) -> str:
    """What goes on from a stop for `reason` (stop_reason's): the end of sequence has no limit to raise."""
    return next((way for start, way in GOING_ON if reason.startswith(start)), "rewind")


def stop_reason(
    ids: Sequence[int],
    stop_string: Callable[[], str | None],
    prompt_len: int,
    settings: SamplingSettings,
    eos_ids: Collection[int],
    context: int,
    grammar_complete: Callable[[], bool] = lambda: False,
) -> str | None:
    """Why a journey whose tokens are `ids` must stop now, or None. `stop_string` finds the first of the
    settings' stop strings the generated text holds (only called when there are some); `grammar_complete`
    says whether the settings' grammar allows nothing more (only called when there is one)."""
    if ids[-1] in eos_ids:
        return "end of sequence"
    if len(ids) - prompt_len >= settings.max_new_tokens:
        return f"max new tokens ({settings.max_new_tokens})"
    if settings.stop and (stop := stop_string()) is not None:
        return f"stop string {stop!r}"
    if settings.grammar is not None and grammar_complete():
        return "the grammar is complete"
    if len(ids) >= context:
        return f"context full ({context} tokens)"
    return None
