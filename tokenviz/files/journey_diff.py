"""Where a saved journey differs from the same journey made again: the check that makes `replay --verify`
mean "this file is what the model gives", not only "its tokens come out the same".

Both sides are the journey file's JSON (tokenviz.files.journey_file): the one read, and the one the
verifier builds from its own re-run with the same saver. Every id, text, flag and count must be equal;
every number within a tolerance (the model's or the server's numbers again, on another run of the same
kernels); what describes the run rather than the model (times, memory, the file's format) is not
compared, and neither is what a straight re-run does not make (VERIFIER_LEAVES: other branches,
analyses the user ran on screen, kept attention rows). The first difference is named by its place in
the file, in one line.
"""

from __future__ import annotations

import math
from typing import Any

from tokenviz.contract.text import safe_text, shortened

LOGPROB_TOLERANCE = 1e-3  # nats, and probabilities: a log-probability, a lens row's probability, an entropy
ATTENTION_TOLERANCE = 1e-4  # an attention weight
RUN_FIELDS = frozenset({"ms", "forward_ms", "prefill_ms", "place_ms", "kv_bytes", "memory", "format"})
VERIFIER_LEAVES = frozenset({"branches", "attributions", "logit_differences", "diagnosis"})
KEPT_ROWS = "attention"  # a record's kept rows (replay.records[i].attention): what the screen had computed


def first_difference(recorded: Any, remade: Any, where: str = "") -> str | None:
    """The first place where `recorded` and `remade` differ beyond the tolerances, as one line; None
    where they agree."""
    if isinstance(recorded, dict) and isinstance(remade, dict):
        return _dicts(recorded, remade, where)
    if isinstance(recorded, list) and isinstance(remade, list):
        if len(recorded) != len(remade):
            return f"{_place(where)} holds {len(recorded)} entries in the journey and {len(remade)} when made again"
        for i, (a, b) in enumerate(zip(recorded, remade)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    exact = ".settings" in where  # (what the user set is not a computed number)
    if _is_number(recorded) and _is_number(remade) and not exact and not (type(recorded) is int is type(remade)):
        tolerance = ATTENTION_TOLERANCE if ".attention" in where else LOGPROB_TOLERANCE
        if not math.isclose(float(recorded), float(remade), rel_tol=0.0, abs_tol=tolerance):
            return _differs(where, recorded, remade, f" (beyond {tolerance:g})")
        return None
    if type(recorded) is not type(remade) or recorded != remade:
        return _differs(where, recorded, remade)
    return None


def _dicts(recorded: dict[str, Any], remade: dict[str, Any], where: str) -> str | None:
    skipped = RUN_FIELDS | (VERIFIER_LEAVES if where in ("", ".replay") else frozenset())
    keys = [k for k in recorded if k not in skipped]
    missing = [k for k in remade if k not in skipped and k not in recorded]
    if missing:
        return f"{_place(where)} lacks {safe_text(shortened(missing[0], 40))!r}, which the journey made again has"
    for key in keys:
        if key not in remade:
            return f"{_place(where)} holds {safe_text(shortened(key, 40))!r}, which the journey made again has not"
        if key == KEPT_ROWS and where.startswith(".replay.records") and remade[key] is None:
            continue  # (rows the screen computed: a straight re-run keeps none)
        found = first_difference(recorded[key], remade[key], f"{where}.{key}")
        if found is not None:
            return found
    return None


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _place(where: str) -> str:
    return safe_text(where.removeprefix(".")) or "the journey"


def _differs(where: str, recorded: Any, remade: Any, beyond: str = "") -> str:
    def shown(value: Any) -> str:
        return safe_text(shortened(repr(value), 60))

    return f"{_place(where)} is {shown(recorded)} in the journey and {shown(remade)} when made again{beyond}"
