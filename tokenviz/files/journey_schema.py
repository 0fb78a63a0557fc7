"""The journey file's schema: the contract's records themselves (their annotations say what each
value may be: tokenviz.contract.bounds), inside the file's envelope, read by pydantic from a file that
may be damaged or hostile.

Beyond each value, the envelope checks the cross-references the panes rely on (ids in the vocabulary,
one record per generated token, attention blocks as large as the positions they cover). A problem
names its field. Reading is in two passes: the grammars and the intervention sets the records name
(small), then the rest, which names them.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, fields
from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from tokenviz.contract.bounds import (
    FAIL_FAST,
    GRAMMARS,
    INTERVENTION_SETS,
    MAX_TOKENS,
    Count,
    Flag,
    Id,
    Positive,
    Text,
    first_error,
    unicode,
)
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import MAX_GRAMMAR_CHARS, GrammarKind
from tokenviz.contract.interventions import MAX_INTERVENTIONS, intervention_from_json
from tokenviz.contract.records import MAX_PINNED, ModelInfo, Routing, StepRecord, TokenChip
from tokenviz.contract.results import Attribution, BranchSummary, LogitDifference
from tokenviz.contract.settings import SavedSettings, grammars_from_json
from tokenviz.contract.text import safe_text
from tokenviz.files.documents import TRACE_STEP_KEYS

FORMAT = "tokenviz-journey/2"  # 2: each step once, in the records (1 held the trace document's steps beside them)
EARLIER_FORMATS = ("tokenviz-journey/1",)  # what still reads (as_current)
LOGPROB_SLACK = 1e-3  # a served log-probability above 0 by float rounding (as the served engine takes them)
MAX_GRAMMARS = 64  # grammars one journey file may hold
MAX_ANALYSES = 64  # attributions, and logit differences, one journey file may hold


class Model(BaseModel):
    """Frozen; fields a newer tokenviz adds are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Array(Model):
    """A float16 array as base64, with its shape: (layers, heads, queries, keys)."""

    shape: Annotated[list[Count], FAIL_FAST, Field(min_length=4, max_length=4)]
    float16: Annotated[str, Field(strict=True)]

    @model_validator(mode="after")
    def _size(self) -> Array:
        try:
            raw = base64.b64decode(self.float16, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("the array is not base64") from None
        if len(raw) != math.prod(self.shape) * 2:
            raise ValueError(f"the array holds {len(raw) // 2} values, not the {math.prod(self.shape)} its shape says")
        return self

    def array(self) -> np.ndarray:
        return np.frombuffer(base64.b64decode(self.float16), dtype=np.float16).reshape(self.shape)

    @classmethod
    def of(cls, a: np.ndarray) -> Array:
        return cls.model_construct(
            shape=list(a.shape), float16=base64.b64encode(a.astype(np.float16).tobytes()).decode()
        )


@dataclass(frozen=True)
class SavedStep(StepRecord):
    """A step's record as a file keeps it: with the attention rows the file kept (see
    tokenviz.files.journey_file), and checked for what holds between its fields."""

    attention: Array | None = None

    def __post_init__(self) -> None:
        d, n = self.decision, len(self.decision.watch)
        if len(d.raw_probs) != n or any(len(stage.probs) != n for stage in d.stages):
            raise ValueError(f"every stage needs one probability per watched token ({n})")
        if self.routing is not None:
            _check_routing(self.routing, len(self.input_ids))

    @classmethod
    def of(cls, record: StepRecord, attention: np.ndarray | None) -> SavedStep:
        """`record` as a file keeps it, with the attention rows kept of it (`attention`)."""
        kept = {f.name: getattr(record, f.name) for f in fields(StepRecord)}
        kept["prompt_predictions"] = tuple(record.prompt_predictions)  # the prefill's makes each when read
        return cls(**kept, attention=None if attention is None else Array.of(attention))

    @property
    def record(self) -> StepRecord:
        """The record itself, as the panes hold it."""
        return StepRecord(**{f.name: getattr(self, f.name) for f in fields(StepRecord)})


def _check_routing(routing: Routing, positions: int) -> None:
    """A routing's byte arrays hold what its shape says, and values a router can give."""
    if routing.positions != positions:
        raise ValueError(f"the routing covers {routing.positions} positions, the record {positions}")
    per_layer = routing.positions * len(routing.layers)
    sizes = [("experts", per_layer * routing.k, 2), ("weights", per_layer * routing.k, 4), ("entropy", per_layer, 4)]
    sizes += [("shared", per_layer, 4)] if routing.shared else []  # NaN where a layer has no shared expert
    for name, count, width in sizes:
        raw = getattr(routing, name)
        if len(raw) != count * width:
            raise ValueError(f"the routing's {name} hold {len(raw) // width} values, not the {count} it says")
        if name in ("weights", "entropy") and not np.isfinite(np.frombuffer(raw, dtype=np.float32)).all():
            raise ValueError(f"the routing's {name} must be finite numbers")


def _strings_unicode(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for d in group:
        for value in d.values():
            if isinstance(value, str):
                unicode(value)
    return group


InterventionSets = Annotated[
    tuple[Annotated[list[dict[str, Any]], Field(max_length=MAX_INTERVENTIONS), AfterValidator(_strings_unicode)], ...],
    FAIL_FAST,
    Field(max_length=MAX_TOKENS),
]


def covers_from_top_only(info: Any) -> Any:
    """A file saved before `covers` said a server's top N as `top_only` (only a server's was one), or
    before its backend said what a step is, where it named the host a served model's steps went to
    (`remote`)."""
    if isinstance(info, dict) and "top_only" in info and "covers" not in info:
        info = {k: v for k, v in info.items() if k != "top_only"} | {"covers": info["top_only"]}
        if info["covers"] and not info.get("remote"):
            info |= {"requests": "a server", "numbers_of": "the server"}
    if isinstance(info, dict) and "remote" in info:
        host = info["remote"]
        info = {k: v for k, v in info.items() if k != "remote"}
        if isinstance(host, str) and host:
            info |= {"requests": f"the server at {host}", "numbers_of": "the server"}
    return info


class Replay(Model):
    info: ModelInfo
    chips: Annotated[tuple[TokenChip, ...], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    chat: Flag = False
    system: Text | None = None
    prompt_len: Positive
    prompt_text: Text
    records: Annotated[tuple[SavedStep, ...], FAIL_FAST, Field(min_length=1, max_length=MAX_TOKENS)]
    stop_reason: Text | None
    branches: Annotated[tuple[BranchSummary, ...], FAIL_FAST, Field(max_length=MAX_TOKENS)] = ()
    pinned: Annotated[tuple[tuple[Id, Text], ...], FAIL_FAST, Field(max_length=MAX_PINNED)] = ()
    attributions: Annotated[tuple[Attribution, ...], FAIL_FAST, Field(max_length=MAX_ANALYSES)] = ()
    logit_differences: Annotated[tuple[LogitDifference, ...], FAIL_FAST, Field(max_length=MAX_ANALYSES)] = ()
    intervention_sets: InterventionSets = ()  # each set once: the records name them by index

    @field_validator("info", mode="before")
    @classmethod
    def _served_before_covers(cls, data: Any) -> Any:
        return covers_from_top_only(data)

    def _experts_known(self) -> None:
        """Every expert a routing names is one of the model's (when the file says how many it has)."""
        experts = self.info.experts
        for record in self.records:
            routing = record.routing
            if routing is None or not experts:
                continue
            if routing.k > experts:
                raise ValueError(f"record {record.index} routes to {routing.k} experts of the model's {experts}")
            named = np.frombuffer(routing.experts, dtype=np.uint16)
            if named.size and int(named.max()) >= experts:
                raise ValueError(
                    f"record {record.index} names expert {int(named.max())}; the model has 0-{experts - 1}"
                )

    @model_validator(mode="after")
    def _log_probabilities(self) -> Replay:
        """A served journey's candidates carry the server's log-probabilities (not logits): none above 0."""
        for record in self.records if self.info.covers else ():
            candidates = [*record.top, *(record.unsteered.top if record.unsteered else ())]
            candidates += [c for p in record.prompt_predictions for c in p.top]
            high = max((c.logit for c in candidates), default=0.0)
            if high > LOGPROB_SLACK:
                raise ValueError(
                    f"record {record.index} holds a log-probability of {high:g}, above 0: no distribution has it"
                )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> Replay:
        """What the panes index by: checked here, so no damaged file can make them fail."""
        info, n = self.info, self.prompt_len
        generated = len(self.chips) - n
        if generated < 0:
            raise ValueError(f"prompt_len {n} is longer than the {len(self.chips)} tokens")
        if len(self.records) != generated + (0 if self.stop_reason else 1):
            raise ValueError(f"{len(self.records)} records for {generated} generated tokens")
        ids = [c.id for c in self.chips] + [r.decision.chosen_id for r in self.records]
        ids += [c.id for r in self.records for c in r.top] + [w[0] for r in self.records for w in r.decision.watch]
        if max(ids, default=0) >= info.vocab:
            raise ValueError(f"a token id is outside the vocabulary of {info.vocab}")
        ids += [p.id for r in self.records for p in r.decision.pinned] + [p[0] for p in self.pinned]
        ids += [t for d in self.logit_differences for t in (d.a_id, d.b_id)]
        if max(ids, default=0) >= info.vocab:
            raise ValueError(f"a token id is outside the vocabulary of {info.vocab}")
        self._experts_known()
        self._analyses_fit()
        self._attention_fits()
        return self

    def _analyses_fit(self) -> None:
        """Each attribution and logit difference explains a token of this journey, after a position in it."""
        info = self.info
        for a in self.attributions:
            if a.position + 1 > len(self.chips) or a.target_id >= info.vocab:
                raise ValueError(f"an attribution of position {a.position} does not fit this journey")
            if len(a.scores) != a.position + 1:
                raise ValueError(f"{len(a.scores)} scores for the {a.position + 1} positions up to {a.position}")
        for d in self.logit_differences:
            if d.position + 1 > len(self.chips) or len(d.mlp) != info.layers or len(d.attention) != len(d.mlp):
                raise ValueError(f"a logit difference at position {d.position} does not fit this journey")

    def _attention_fits(self) -> None:
        """The attention rows kept are the newest, and each block is as large as the positions it covers."""
        info, n = self.info, self.prompt_len
        saved = [i for i, record in enumerate(self.records) if record.attention is not None]
        if saved and saved != list(range(saved[0], len(self.records))):
            raise ValueError("the attention rows kept must be the newest, without gaps")
        for i in saved:
            array = self.records[i].attention
            assert array is not None
            layers, heads, queries, keys = array.shape
            rows, columns = (n, n) if i == 0 else (1, n + i)  # the prompt's newest rows, then one per step
            if layers != info.layers or heads != info.heads or not 1 <= queries <= rows or keys < columns:
                raise ValueError(
                    f"record {i}'s attention is {array.shape}; it needs [{info.layers}, {info.heads}, "
                    f"1 to {rows}, at least {columns}]"
                )


class PromptToken(Model):
    id: Id
    text: Text


class SavedGrammar(Model):
    kind: GrammarKind
    source: Text
    text: Annotated[str, Field(strict=True, max_length=MAX_GRAMMAR_CHARS), AfterValidator(unicode)]


Grammars = Annotated[dict[str, SavedGrammar], Field(max_length=MAX_GRAMMARS)]  # by digest; settings name them
# What the trace's views added to each step (its lens, an attention row, routing, attribution), in the trace
# document's words: read back by `replay --json` and by `replay --verify`, which makes the same views again.
StepViews = Annotated[tuple[dict[str, JsonValue], ...], FAIL_FAST, Field(max_length=MAX_TOKENS)]


class Journey(Model):
    """A journey file: the trace document's head (its steps are the records: files.journey_file), the
    records, and what the trace's views added to each step (`step_views`)."""

    format: Annotated[str, Field(strict=True)]
    settings: SavedSettings
    prompt: Annotated[tuple[PromptToken, ...], FAIL_FAST, Field(min_length=1, max_length=MAX_TOKENS)]
    replay: Replay
    grammars: Grammars = {}
    step_views: StepViews = ()

    @property
    def generated(self) -> int:
        """The tokens the journey took: one step each."""
        return len(self.replay.chips) - self.replay.prompt_len


class _Sets(Model):
    intervention_sets: InterventionSets = ()


class _Tables(Model):
    """What the records name, read first: the grammars and the intervention sets."""

    grammars: Grammars = {}
    replay: _Sets

    def context(self) -> dict[str, Any]:
        """The validation context the records read (tokenviz.contract.bounds)."""
        try:
            grammars = grammars_from_json({digest: g.model_dump() for digest, g in self.grammars.items()})
        except TokenvizError as exc:
            raise _TableError(("grammars",), str(exc)) from None
        sets = []
        for i, group in enumerate(self.replay.intervention_sets):
            try:
                sets.append(tuple(intervention_from_json(d) for d in group))
            except TokenvizError as exc:
                raise _TableError(("replay", "intervention_sets", i), str(exc)) from None
        return {GRAMMARS: grammars, INTERVENTION_SETS: sets}


class _TableError(Exception):
    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.where = where


def as_current(doc: Any) -> Any:
    """A journey file's JSON in this tokenviz's format: an earlier one's steps (the trace document's,
    beside the records) become what its views added to each (`step_views`), for a file holds each step
    once now; anything else as it is."""
    if not isinstance(doc, dict) or doc.get("format") not in EARLIER_FORMATS:
        return doc
    current = {key: value for key, value in doc.items() if key != "steps"} | {"format": FORMAT}
    steps = doc.get("steps")
    views = [
        {key: value for key, value in step.items() if key not in TRACE_STEP_KEYS} if isinstance(step, dict) else {}
        for step in (steps if isinstance(steps, list) else ())
    ]
    if any(views):
        current["step_views"] = views
    return current


def parse_journey(doc: Any) -> Journey:
    """The journey in `doc` (parsed JSON, this format or an earlier one), validated; a TokenvizError names
    the first bad field."""
    doc = as_current(doc)
    try:
        context = _Tables.model_validate(doc).context()
        return Journey.model_validate(doc, context=context)
    except ValidationError as exc:
        why = first_error(exc)
    except _TableError as exc:
        place = ".".join(str(part) for part in exc.where) or "the top level"
        why = f"at {safe_text(place)}: {safe_text(str(exc))}"  # keys are the file's
    raise TokenvizError(f"the journey file is damaged {why}") from None


def journey_json_schema() -> dict[str, Any]:
    """The journey file's JSON Schema, made from the same types that read it."""
    return Journey.model_json_schema()
