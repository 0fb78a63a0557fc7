"""Where a saved journey differs from the same journey made again: the check that makes `replay --verify`
mean "this file is what the model gives", not only "its tokens come out the same".

Both sides are the journey file's JSON (tokenviz.files.journey_file): the one read, and the one the
verifier builds from its own re-run with the same saver. Every id, text, flag and count must be equal;
every number within a tolerance (the model's or the server's numbers again, on another run of the same
kernels); what describes the run rather than the model (times, memory, the file's format) is not
compared, and neither are the other branches (VERIFIER_LEAVES: a file keeps their summaries, not their
steps, so they cannot be run again; the verdict says so). The analyses the user ran on screen and the
attention rows the file keeps are made again at the same places and compared. The first difference is
named by its place in the file, in one line.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from tokenviz.contract.text import safe_text, shortened

LOGPROB_TOLERANCE = 1e-3  # nats, and probabilities: a log-probability, a lens row's probability, an entropy
ATTENTION_TOLERANCE = 1e-4  # an attention weight
RUN_FIELDS = frozenset({"ms", "forward_ms", "prefill_ms", "place_ms", "kv_bytes", "memory", "format"})
VERIFIER_LEAVES = frozenset({"branches"})
KEPT_ROWS_TOLERANCE = ATTENTION_TOLERANCE + 2**-11  # a kept row's weight: float16 in the file (its step below 1)


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
    exact = ".settings" in where  # what the user set is not a computed number
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
        if key == "float16" and isinstance(recorded[key], str) and isinstance(remade[key], str):
            found = _kept_rows(recorded[key], remade[key], f"{where}.{key}")
        else:
            found = first_difference(recorded[key], remade[key], f"{where}.{key}")
        if found is not None:
            return found
    return None


def _kept_rows(recorded: str, remade: str, where: str) -> str | None:
    """Kept attention rows (base64 of float16 weights; their shapes are compared beside them)."""
    try:
        a = np.frombuffer(base64.b64decode(recorded, validate=True), dtype=np.float16).astype(np.float32)
    except ValueError:
        return f"{_place(where)} is not base64 of float16 weights in the journey"
    b = np.frombuffer(base64.b64decode(remade), dtype=np.float16).astype(np.float32)
    if a.shape != b.shape:
        return f"{_place(where)} holds {a.size} weights in the journey and {b.size} when made again"
    off = np.abs(a - b)
    off[np.isnan(off)] = np.inf
    if off.size and float(off.max()) > KEPT_ROWS_TOLERANCE:
        i = int(off.argmax())
        return _differs(f"{where}[{i}]", float(a[i]), float(b[i]), f" (beyond {KEPT_ROWS_TOLERANCE:.1e})")
    return None


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _place(where: str) -> str:
    return safe_text(where.removeprefix(".")) or "the journey"


def _differs(where: str, recorded: Any, remade: Any, beyond: str = "") -> str:
    def shown(value: Any) -> str:
        return safe_text(shortened(repr(value), 60))

    return f"{_place(where)} is {shown(recorded)} in the journey and {shown(remade)} when made again{beyond}"
