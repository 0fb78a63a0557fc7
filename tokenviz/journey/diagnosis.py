"""Why does the output look like this? The source texts' table of unexpected outputs, read off what the
journey measured: each symptom with its evidence by position and the remedy the settings offer.

Only what was measured is said: a text cut by the new-token limit, a repeated run of tokens (and the
steps where the loop's next token won), draws far down the model's own ranking (past rank 10 at a high
temperature, past 100 at any).
Whether a format was followed is the model's (or a grammar's) and is not guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenviz.contract.records import StepRecord
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.symptoms import DrawnAt, Symptom

SENTENCE_ENDS = tuple(".!?…\"')]}>`\n") + ("。", "！", "？")  # a text that ends on one of these is not cut mid-sentence
LOOP = 4  # tokens in a run that counts as repeated when it comes back
HOT = 1.0  # a temperature above this lets unlikely tokens through
FAR = 10  # a draw below this raw rank is far down the model's own ranking (at a high temperature)
VERY_FAR = 100  # below this raw rank a draw is the symptom at any temperature (top-k or top-p would cut it)
LOW_TEMPERATURE = 0.3  # at or below it (greedy included), a model's loops are kept


def diagnose(
    records: Sequence[StepRecord],
    ids: Sequence[int],
    prompt_len: int,
    text: str,
    stop_reason: str | None,
    settings: SamplingSettings,
    piece: Any,
) -> list[Symptom]:
    """The symptoms of the generated text `text` (tokens `ids[prompt_len:]`, each chosen at the record of
    the same index), as measured; none where nothing was."""
    generated = list(ids[prompt_len:])
    taken = list(records[: len(generated)])
    found = [_cut(text, stop_reason, settings, len(generated))]
    found.append(_repetition(generated, taken, prompt_len, settings, piece))
    found.append(_far_draws(taken, settings))
    return [s for s in found if s is not None]


def _cut(text: str, stop_reason: str | None, settings: SamplingSettings, new_tokens: int) -> Symptom | None:
    """Cut off by the new-token limit: the limit and the new tokens it stopped at (both new tokens, the
    prompt's not counted), and how the text ends."""
    if not (stop_reason or "").startswith("max new tokens") or not text.strip():
        return None
    if text.rstrip(" ").endswith(SENTENCE_ENDS):
        return None
    return Symptom(
        "cut off mid-sentence",
        "the new-token limit",
        f"raise the new-token limit (max_new_tokens; --steps headless) above {settings.max_new_tokens}",
        (("limit", settings.max_new_tokens), ("new_tokens", new_tokens), ("ends_with", text[-24:])),
    )


def _repetition(
    generated: list[int], taken: list[StepRecord], prompt_len: int, settings: SamplingSettings, piece: Any
) -> Symptom | None:
    """The first run of LOOP tokens that comes back, where it does, and the steps where the token that
    went on repeating it won (its raw rank and probability)."""
    seen: dict[tuple[int, ...], int] = {}
    for start in range(len(generated) - LOOP + 1):
        run = tuple(generated[start : start + LOOP])
        if run not in seen:
            seen[run] = start
            continue
        first = seen[run]
        again = [i for i in range(len(generated) - LOOP + 1) if tuple(generated[i : i + LOOP]) == run]
        won = tuple(
            DrawnAt(prompt_len + i, r.decision.raw_rank, r.decision.raw_prob)
            for i, r in enumerate(taken)
            if any(a <= i < a + LOOP for a in again if a != first)
        )
        penalties = settings.frequency_penalty or settings.presence_penalty or settings.repetition_penalty != 1
        cold = settings.greedy or settings.temperature <= LOW_TEMPERATURE
        cause = "a low temperature and no penalty" if cold and not penalties else "the model's own loop"
        return Symptom(
            "repetitive",
            cause,
            "add a frequency penalty (0.3, as the creative preset) or raise the temperature",
            (("run", "".join(piece(t) for t in run)), ("at", tuple(prompt_len + a for a in again)), ("loop_won", won)),
        )
    return None


def _far_draws(taken: list[StepRecord], settings: SamplingSettings) -> Symptom | None:
    """Tokens drawn far down the model's own ranking: past FAR at a high temperature; past VERY_FAR at any
    (at 1.0 with no top-k or top-p, a token of raw rank 3,916 and p 1.5e-05 was drawn, and the text went
    astray). A branch's forced token is the user's choice, not a draw."""
    if settings.greedy:
        return None
    hot = settings.temperature > HOT
    past = FAR if hot else VERY_FAR
    far = tuple(
        DrawnAt(r.position, r.decision.raw_rank, r.decision.raw_prob)
        for r in taken
        if r.decision.raw_rank > past and r.decision.mode != "forced"
    )
    if not far:
        return None
    if hot:
        cause = f"a temperature of {settings.temperature:g}: draws far down the model's own ranking"
        remedy = "lower the temperature (0.7 and top-p 0.9, the balanced preset; 0.2 for facts)"
    else:
        cause = f"draws past rank {VERY_FAR} of the model's own ranking, which nothing cut from the draw"
        remedy = "cut the tail from the draw: top-p 0.9 or top-k 50 (the balanced preset)"
    return Symptom(
        "inconsistent or incoherent",
        cause,
        remedy,
        (("temperature", settings.temperature), ("draws_past_rank", past), ("steps", far)),
    )
