"""The journey file's schema: a validating parser for files that may be damaged or hostile.

Every field's type, range and shape is checked, and the cross-references the panes rely on (ids in
the vocabulary, one record per generated token, attention blocks as large as the positions they
cover); every string is made safe to print (control characters become their <0x..> form, so an
escape sequence in a file can never reach the terminal). A problem names its field.

Checking costs what the file costs: every list has a length bound, and a list stops at its first
bad element (FailFast), so a file of many bad numbers makes one error, not one per number.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, FailFast, Field, ValidationError, model_validator

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import MAX_GRAMMAR_CHARS, Grammar, GrammarKind
from tokenviz.contract.interventions import MAX_INTERVENTIONS, Intervention, intervention_from_json
from tokenviz.contract.records import MAX_PINNED, Routing
from tokenviz.contract.settings import SamplingSettings, grammars_from_json
from tokenviz.contract.text import safe_text

MAX_TOKENS = 131_072  # chips or records in one journey
MAX_LAYERS = 4096
MAX_EXPERTS_PER_TOKEN = 64
MAX_CANDIDATES = 1024  # a top-n list (tokenviz keeps 20)
MAX_STAGES = 32  # sampling stages of one decision (tokenviz has at most 8)
MAX_FOLLOWED = 64  # tokens followed through the stages (tokenviz follows at most 25)
LOGPROB_SLACK = 1e-3  # a served log-probability above 0 by float rounding (as the served engine takes them)
FAIL_FAST = FailFast()  # a list stops at its first bad element


def _unicode(text: str) -> str:
    """Refuse a string JSON can carry but Unicode cannot (a lone surrogate, \\ud800): it could not
    be printed, exported or saved again."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the text is not valid Unicode (it holds a lone surrogate)") from None
    return text


# Every leaf is strict (no "0.5" for a number, no 1 for a flag); lists may stand for tuples, as in JSON.
SafeText = Annotated[str, Field(strict=True), AfterValidator(_unicode), AfterValidator(safe_text)]
Flag = Annotated[bool, Field(strict=True)]
Count = Annotated[int, Field(strict=True, ge=0)]
Positive = Annotated[int, Field(strict=True, ge=1)]
Id = Count
Probability = Annotated[float, Field(strict=True, ge=0.0, le=1.0 + 1e-6, allow_inf_nan=False)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)]


MAX_GRAMMARS = 64  # grammars one journey file may hold


class Model(BaseModel):
    """Frozen; fields a newer tokenviz adds are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class Settings(Model):
    """Sampling settings, validated by SamplingSettings itself."""

    model_config = ConfigDict(frozen=True, extra="allow")

    def settings(self, grammars: Mapping[str, Grammar] | None = None) -> SamplingSettings:
        """The settings; their grammar, if any, from the file's `grammars` (Journey checks it is there)."""
        settings = SamplingSettings.from_json(self.model_dump(), grammars)
        return settings.replace(stop=tuple(safe_text(stop) for stop in settings.stop))

    @property
    def grammar_digest(self) -> str | None:
        reference = self.model_dump().get("grammar")
        return reference["digest"] if isinstance(reference, dict) else None

    @model_validator(mode="after")
    def _valid(self) -> Settings:
        stops = self.model_dump().get("stop")
        for value in stops if isinstance(stops, list) else ():  # (anything else: SamplingSettings says)
            if isinstance(value, str):
                _unicode(value)
        d = self.model_dump()
        reference = d.pop("grammar", None)
        if reference is not None and not (isinstance(reference, dict) and isinstance(reference.get("digest"), str)):
            raise ValueError("a grammar is named by its digest: {kind, source, digest}")
        try:
            SamplingSettings.from_json(d)
        except (TokenvizError, TypeError) as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
        return self


class Info(Model):
    name: SafeText
    device: SafeText
    dtype: SafeText
    # 0 where the engine does not expose them (a served model)
    layers: Annotated[int, Field(strict=True, ge=0, le=MAX_LAYERS)]
    heads: Annotated[int, Field(strict=True, ge=0, le=4096)]
    kv_heads: Annotated[int, Field(strict=True, ge=0, le=4096)]
    head_dim: Annotated[int, Field(strict=True, ge=0, le=65536)]
    hidden: Annotated[int, Field(strict=True, ge=0)]
    vocab: Annotated[int, Field(strict=True, ge=1, le=100_000_000)]
    context: Positive
    architecture: SafeText
    tied_embeddings: Flag
    positions: SafeText
    attention: SafeText = "eager"
    memory: SafeText = ""
    placement: SafeText = ""
    quantization: SafeText = ""
    queries_kept: SafeText = ""
    compiled: SafeText = ""
    latent_kv: Flag = False
    experts: Annotated[int, Field(strict=True, ge=0, le=65_535)] = 0  # (0: dense, or recorded before it was kept)
    capabilities: Annotated[list[SafeText], Field(max_length=64)] = []  # the recording engine's (see contract.engine)
    distribution: SafeText = ""
    internals: SafeText = ""
    runtime: SafeText = ""
    remote: SafeText = ""
    covers: Annotated[int, Field(strict=True, ge=0, le=100_000)] = 0
    draws: SafeText = ""

    @model_validator(mode="before")
    @classmethod
    def _served_before_covers(cls, data: Any) -> Any:
        """A file saved before `covers` said a server's top N as `top_only` (only a server's was one)."""
        if isinstance(data, dict) and "top_only" in data and "covers" not in data:
            data = {k: v for k, v in data.items() if k != "top_only"} | {"covers": data["top_only"]}
            if data["covers"] and not data.get("remote"):
                data["remote"] = "a server"
        return data


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


class SavedRouting(Model):
    """A record's mixture-of-experts routing (tokenviz.contract.records.Routing): its byte arrays as
    base64, checked against the shape they claim and for values a router can give."""

    layers: Annotated[list[Count], FAIL_FAST, Field(min_length=1, max_length=MAX_LAYERS)]
    k: Annotated[int, Field(strict=True, ge=1, le=MAX_EXPERTS_PER_TOKEN)]
    positions: Annotated[int, Field(strict=True, ge=1, le=MAX_TOKENS)]
    experts: Annotated[str, Field(strict=True)]  # uint16
    weights: Annotated[str, Field(strict=True)]  # float32
    entropy: Annotated[str, Field(strict=True)]  # float32
    shared: Annotated[str, Field(strict=True)] = ""  # float32, NaN where a layer has no shared expert

    @model_validator(mode="after")
    def _sizes(self) -> SavedRouting:
        per_layer = self.positions * len(self.layers)
        sizes = [("experts", per_layer * self.k, 2), ("weights", per_layer * self.k, 4), ("entropy", per_layer, 4)]
        sizes += [("shared", per_layer, 4)] if self.shared else []  # (NaN where a layer has no shared expert)
        for name, count, width in sizes:
            try:
                raw = base64.b64decode(getattr(self, name), validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f"the routing's {name} are not base64") from None
            if len(raw) != count * width:
                raise ValueError(f"the routing's {name} hold {len(raw) // width} values, not the {count} it says")
            if name in ("weights", "entropy") and not np.isfinite(np.frombuffer(raw, dtype=np.float32)).all():
                raise ValueError(f"the routing's {name} must be finite numbers")
        return self

    def routing(self) -> Routing:
        return Routing(
            layers=tuple(self.layers),
            k=self.k,
            positions=self.positions,
            experts=base64.b64decode(self.experts),
            weights=base64.b64decode(self.weights),
            entropy=base64.b64decode(self.entropy),
            shared=base64.b64decode(self.shared),
        )


Candidate = tuple[Id, SafeText, Finite, Probability]
Candidates = Annotated[list[Candidate], FAIL_FAST, Field(max_length=MAX_CANDIDATES)]
MAX_PLACES = 64  # GPUs, the CPU and the disk
Place = Annotated[str, Field(strict=True, pattern=r"^[a-z]{2,8}(:\d{1,3})?$")]  # cuda:0, cpu, disk, …
Stage = tuple[
    SafeText, SafeText, Count, Probability, Annotated[list[Probability], FAIL_FAST, Field(max_length=MAX_FOLLOWED)]
]
Prediction = tuple[Count, Candidates, NonNegative, Id, SafeText, Probability, Positive]


class Decision(Model):
    mode: Literal["greedy", "sampled", "forced", "drawn"]
    settings: Settings
    watch: Annotated[list[tuple[Id, SafeText]], FAIL_FAST, Field(max_length=MAX_FOLLOWED)]
    raw_probs: Annotated[list[Probability], FAIL_FAST, Field(max_length=MAX_FOLLOWED)]
    stages: Annotated[list[Stage], FAIL_FAST, Field(max_length=MAX_STAGES)]
    u: Annotated[float, Field(strict=True, ge=0.0, lt=1.0)] | None
    band: tuple[Probability, Probability] | None
    chosen_id: Id
    chosen_text: SafeText
    chosen_prob: Probability
    chosen_rank: Positive
    raw_rank: Positive
    raw_prob: Probability
    ms: NonNegative
    pinned: Annotated[
        list[tuple[Id, SafeText, Probability, Probability, Positive]], FAIL_FAST, Field(max_length=MAX_PINNED)
    ] = []

    @model_validator(mode="after")
    def _watched(self) -> Decision:
        n = len(self.watch)
        if len(self.raw_probs) != n or any(len(stage[4]) != n for stage in self.stages):
            raise ValueError(f"every stage needs one probability per watched token ({n})")
        return self


class SavedUnsteered(Model):
    top: Candidates
    kl: NonNegative
    ms: NonNegative = 0.0
    kl_floor: bool = False


class Record(Model):
    index: Count
    position: Count
    input_ids: Annotated[list[Id], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    input_texts: Annotated[list[SafeText], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    top: Candidates
    entropy: NonNegative
    attention: Array | None = None  # rows the file kept (see tokenviz.files.journey_file)
    forward_ms: NonNegative
    place_ms: Annotated[list[tuple[Place, NonNegative]], FAIL_FAST, Field(max_length=MAX_PLACES)] = []
    kv_len: Count
    kv_bytes: Count
    decision: Decision
    prompt_predictions: Annotated[list[Prediction], FAIL_FAST, Field(max_length=MAX_TOKENS)] = []
    routing: SavedRouting | None = None
    interventions: Count | None = None  # an index into Replay.intervention_sets
    unsteered: SavedUnsteered | None = None

    @model_validator(mode="after")
    def _routed_positions(self) -> Record:
        if self.routing is not None and self.routing.positions != len(self.input_ids):
            raise ValueError(f"the routing covers {self.routing.positions} positions, the record {len(self.input_ids)}")
        return self


class Branch(Model):
    index: Annotated[int, Field(strict=True, ge=-1)]
    text: SafeText
    tokens: Count
    logprob: Annotated[float, Field(strict=True, le=0, allow_inf_nan=False)]
    mean_entropy: NonNegative
    shared: Count
    current: Flag


class SavedAttribution(Model):
    method: Literal["loo", "grad"]
    position: Count
    target_id: Id
    target_text: SafeText
    logprob: Finite
    scores: Annotated[list[Finite], FAIL_FAST, Field(max_length=MAX_TOKENS)]

    @model_validator(mode="after")
    def _one_score_a_position(self) -> SavedAttribution:
        if len(self.scores) != self.position + 1:
            raise ValueError(f"{len(self.scores)} scores for the {self.position + 1} positions up to {self.position}")
        return self


class SavedLogitDifference(Model):
    position: Count
    a_id: Id
    a_text: SafeText
    b_id: Id
    b_text: SafeText
    total: Finite
    embedding: Finite
    attention: Annotated[list[Finite], FAIL_FAST, Field(max_length=MAX_LAYERS)]
    mlp: Annotated[list[Finite], FAIL_FAST, Field(max_length=MAX_LAYERS)]
    bias: Finite
    softcap: Finite

    @model_validator(mode="after")
    def _one_share_a_layer(self) -> SavedLogitDifference:
        if len(self.attention) != len(self.mlp):
            raise ValueError(f"{len(self.attention)} attention shares but {len(self.mlp)} MLP shares")
        return self


class Replay(Model):
    info: Info
    chips: Annotated[
        list[tuple[Id, SafeText, Flag, Flag] | tuple[Id, SafeText, Flag, Flag, Flag]],
        FAIL_FAST,
        Field(max_length=MAX_TOKENS),
    ]  # id, text, prompt, special, and (since chat mode) added by the chat template
    chat: Flag = False
    system: SafeText | None = None
    prompt_len: Positive
    prompt_text: SafeText
    records: Annotated[list[Record], FAIL_FAST, Field(min_length=1, max_length=MAX_TOKENS)]
    stop_reason: SafeText | None
    branches: Annotated[list[Branch], FAIL_FAST, Field(max_length=MAX_TOKENS)] = []
    pinned: Annotated[list[tuple[Id, SafeText]], FAIL_FAST, Field(max_length=MAX_PINNED)] = []
    attributions: Annotated[list[SavedAttribution], FAIL_FAST, Field(max_length=64)] = []
    logit_differences: Annotated[list[SavedLogitDifference], FAIL_FAST, Field(max_length=64)] = []
    intervention_sets: Annotated[
        list[Annotated[list[dict[str, Any]], Field(max_length=MAX_INTERVENTIONS)]],
        FAIL_FAST,
        Field(max_length=MAX_TOKENS),
    ] = []

    @property
    def intervention_table(self) -> list[tuple[Intervention, ...]]:
        return [tuple(intervention_from_json(d) for d in group) for group in self.intervention_sets]

    @model_validator(mode="after")
    def _interventions(self) -> Replay:
        for group in self.intervention_sets:
            for d in group:
                for value in d.values():
                    if isinstance(value, str):
                        _unicode(value)
        try:
            table = self.intervention_table
        except TokenvizError as exc:
            raise ValueError(str(exc)) from None
        for record in self.records:
            if record.interventions is not None and record.interventions >= len(table):
                raise ValueError(f"record {record.index} names intervention set {record.interventions}, not held")
        return self

    def _experts_known(self) -> None:
        """Every expert a routing names is one of the model's (when the file says how many it has)."""
        experts = self.info.experts
        for record in self.records:
            routing = record.routing
            if routing is None or not experts:
                continue
            if routing.k > experts:
                raise ValueError(f"record {record.index} routes to {routing.k} experts of the model's {experts}")
            named = np.frombuffer(base64.b64decode(routing.experts), dtype=np.uint16)
            if named.size and int(named.max()) >= experts:
                raise ValueError(
                    f"record {record.index} names expert {int(named.max())}; the model has 0-{experts - 1}"
                )

    @model_validator(mode="after")
    def _log_probabilities(self) -> Replay:
        """A served journey's candidates carry the server's log-probabilities (not logits): none above 0."""
        for record in self.records if self.info.covers else ():
            candidates = [*record.top, *(record.unsteered.top if record.unsteered else ())]
            candidates += [c for p in record.prompt_predictions for c in p[1]]
            high = max((c[2] for c in candidates), default=0.0)
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
        ids = [c[0] for c in self.chips] + [r.decision.chosen_id for r in self.records]
        ids += [c[0] for r in self.records for c in r.top] + [w[0] for r in self.records for w in r.decision.watch]
        if max(ids, default=0) >= info.vocab:
            raise ValueError(f"a token id is outside the vocabulary of {info.vocab}")
        ids += [p[0] for r in self.records for p in r.decision.pinned] + [p[0] for p in self.pinned]
        ids += [t for d in self.logit_differences for t in (d.a_id, d.b_id)]
        if max(ids, default=0) >= info.vocab:
            raise ValueError(f"a token id is outside the vocabulary of {info.vocab}")
        self._experts_known()
        for a in self.attributions:  # each explains a token of this journey, after a position in it
            if a.position + 1 > len(self.chips) or a.target_id >= info.vocab:
                raise ValueError(f"an attribution of position {a.position} does not fit this journey")
        for d in self.logit_differences:
            if d.position + 1 > len(self.chips) or len(d.mlp) != info.layers:
                raise ValueError(f"a logit difference at position {d.position} does not fit this journey")
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
        return self


class PromptToken(Model):
    id: Id
    text: SafeText


class Chosen(Model):
    id: Id


class Draw(Model):
    mode: Literal["greedy", "sampled", "forced", "drawn"]


class Step(Model):
    """What `replay --verify` reads of a step."""

    settings: Settings
    chosen: Chosen
    draw: Draw


class SavedGrammar(Model):
    kind: GrammarKind
    source: SafeText
    text: Annotated[str, Field(strict=True, max_length=MAX_GRAMMAR_CHARS), AfterValidator(_unicode)]


class Journey(Model):
    format: Annotated[str, Field(strict=True)]
    settings: Settings
    prompt: Annotated[list[PromptToken], FAIL_FAST, Field(min_length=1, max_length=MAX_TOKENS)]
    steps: Annotated[list[Step], FAIL_FAST, Field(max_length=MAX_TOKENS)]
    replay: Replay
    grammars: Annotated[dict[str, SavedGrammar], Field(max_length=MAX_GRAMMARS)] = {}  # by digest; settings name them

    @property
    def grammar_table(self) -> dict[str, Grammar]:
        return grammars_from_json({digest: g.model_dump() for digest, g in self.grammars.items()})

    @model_validator(mode="after")
    def _grammars_given(self) -> Journey:
        try:
            table = self.grammar_table
        except TokenvizError as exc:
            raise ValueError(str(exc)) from None
        every = [self.settings, *(s.settings for s in self.steps), *(r.decision.settings for r in self.replay.records)]
        missing = sorted({d for s in every if (d := s.grammar_digest) is not None} - set(table))
        if missing:
            raise ValueError(f"the settings name a grammar the file does not hold: {missing[0]!r:.20}")
        return self


def parse_journey(doc: Any) -> Journey:
    """The journey in `doc` (parsed JSON), validated; a TokenvizError names the first bad field."""
    try:
        return Journey.model_validate(doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = safe_text(".".join(str(part) for part in error["loc"])) or "the top level"  # (keys are the file's)
        message = safe_text(str(error["msg"]).removeprefix("Value error, "))
        raise TokenvizError(f"the journey file is damaged at {where}: {message}") from None
