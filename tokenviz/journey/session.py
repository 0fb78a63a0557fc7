"""The journey: the prompt, the tokens chosen so far, one StepRecord per forward pass.

The last record is *pending* while the session runs: its forward pass is done and its decision is
a preview that settings changes re-decide from the same logits. `step()` commits that decision,
appends the token and runs the next forward; `rewind()` crops the cache and the history so the
state equals the one before those steps, logits included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import numpy as np
import torch

from tokenviz.contract.engine import (
    AttentionRows,
    Capability,
    Engine,
    Forward,
    Intervenable,
    Intervening,
    IsCancelled,
    require,
    shared_prefix,
)
from tokenviz.contract.errors import Cancelled, GiveWay, TokenvizError
from tokenviz.contract.features import FeatureLabel
from tokenviz.contract.interventions import HeadAblation, Intervention
from tokenviz.contract.records import MAX_PINNED, StepRecord
from tokenviz.contract.results import BranchSummary, CacheEvent
from tokenviz.contract.settings import SamplingSettings
from tokenviz.features.feature_edits import with_sae
from tokenviz.features.sparse_autoencoder import SparseAutoencoder
from tokenviz.journey import memory_policy
from tokenviz.journey.analyses import JourneyAnalyses
from tokenviz.journey.branches import Branch, BranchStore, with_branch_source
from tokenviz.journey.decisions import decided_again, decision_for, record_again
from tokenviz.journey.decoded_text import DecodedText
from tokenviz.journey.followed_features import Followed
from tokenviz.journey.grammar_state import GrammarState
from tokenviz.journey.memory_policy import check_memory
from tokenviz.journey.prefill import DeferredPredictions, prefill, prompt_predictions
from tokenviz.journey.prompt import Tokenized, tokenize
from tokenviz.journey.stops import StopSearch, stop_reason
from tokenviz.journey.watching import token_of, with_watched
from tokenviz.tensors.transfer import to_host

TOP_N = 20


class Session:
    def __init__(
        self,
        engine: Engine,
        settings: SamplingSettings | None = None,
        top_n: int = TOP_N,
        prefill_chunk: int | None = None,
    ):
        """`prefill_chunk`: the prompt tokens a prefill feeds in one pass (None: memory_policy's)."""
        self.engine = engine
        self.decision = decision_for(engine)  # made here on the logits, or drawn by the engine (a server)
        self.settings = settings or SamplingSettings()
        self.top_n = top_n
        self.prompt = ""  # the text given: the whole prompt, or the user's message in chat mode
        self.chat = False
        self.system: str | None = None
        self.prompt_ids: list[int] = []
        self.template: list[bool] = []  # per prompt token: added by the chat template
        self.ids: list[int] = []  # prompt + committed tokens
        self.records: list[StepRecord] = []
        self.stop_reason: str | None = None
        self.last_cache_event: CacheEvent | None = None
        self.branches = BranchStore()  # other paths from the same prompt
        self.pinned: tuple[int, ...] = ()  # the tokens followed at every step (see pin)
        self.analyses = JourneyAnalyses(self)  # what the views compute on demand, kept by context
        self.grammars = GrammarState(engine)  # the grammars in use (see journey.grammar_state)
        self.intervening: Intervening | None = None  # the interventions in force (see set_interventions)
        # Interventions another session hooked into these same weights (a comparison opened from a
        # journey with some in force): they act on this session's passes too, so its records say so.
        self.shared_interventions: tuple[Intervention, ...] = ()
        self.saes: tuple[SparseAutoencoder, ...] = ()  # the sparse autoencoders loaded (journey.feature_readings)
        self.watched_features: tuple[tuple[str, int], ...] = ()  # (an SAE's name, a feature) followed
        self.followed = Followed()  # their activations so far (journey.feature_readings.follow_features)
        self.feature_labels: dict[tuple[str, int], FeatureLabel] = {}  # read once a feature (feature_readings)
        self.pending_logits: torch.Tensor | None = None  # the pending step's logits, on the device (None: stopped)
        self._prefill_logits: torch.Tensor | None = None
        self.prefill_chunk = prefill_chunk or memory_policy.PROMPT_CHUNK
        # The text as it grows, decoded a window at a time, and searched for stop strings as it grows.
        self._text, self._generated_text = DecodedText(engine.decode), DecodedText(engine.decode)
        self._stops = StopSearch()
        self.deferred = DeferredPredictions()  # a prefill's predictions not made yet (start's `defer_predictions`)

    # ---- what the journey is now -------------------------------------------------------------

    @property
    def generated_ids(self) -> list[int]:
        return self.ids[len(self.prompt_ids) :]

    @property
    def cached_ids(self) -> list[int]:
        """The tokens the KV cache holds: all of them while a decision is pending; after a stop, all
        but the last one taken."""
        return self.ids[: self.engine.kv_len]

    @property
    def pending(self) -> StepRecord | None:
        return self.records[-1] if self.records and self.stop_reason is None else None

    @property
    def text(self) -> str:
        return self._text.of(self.ids)

    @property
    def generated_text(self) -> str:
        return self._generated_text.of(self.generated_ids)

    def branch_summaries(self) -> list[BranchSummary]:
        """The current path first, then every other branch not contained in it."""
        return self.branches.summaries(self._path, len(self.prompt_ids), self.engine.decode)

    # ---- moves ------------------------------------------------------------------------------------

    def start(
        self,
        prompt: str | list[int],
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        chat: bool = False,
        system: str | None = None,
        defer_predictions: bool = False,
        tokenized: Tokenized | None = None,
    ) -> StepRecord:
        """Tokenize and prefill `prompt` (text, or token ids as they are; `tokenized`: as journey.prompt's
        tokenize made it already, for the same prompt); the first decision becomes
        pending. With `chat`, the text is a user message (after `system`, if given) put through the
        model's chat template. With `defer_predictions`, what the model predicted at every prompt
        position is made later (`score_prompt`), where the engine can: the prefill costs what the
        model's own pass does, and the first decision comes sooner.

        A long prompt is prefilled in chunks: `progress(done, total)` follows them, and `cancelled()`
        stops between them with Cancelled, leaving the journey as it was.
        """
        prompt, ids, template = tokenized or tokenize(self.engine, prompt, chat, system)
        check_memory(self.engine.info, len(ids), self.prefill_chunk)
        previous = self.engine.cache
        self.engine.reset()
        try:
            forward, predictions, forward_ms, deferred = prefill(
                self.engine, ids, self.prefill_chunk, progress, cancelled, defer_predictions
            )
        except BaseException:
            self.engine.use_cache(previous)
            raise
        if ids == self.prompt_ids:
            self._keep_path()  # a reset keeps the path it leaves
        else:
            self.branches.clear()
        self.prompt, self.prompt_ids, self.ids = prompt, list(ids), list(ids)
        self.chat, self.system, self.template = chat, system if chat else None, template
        self.records, self.stop_reason = [], None
        self.deferred = deferred
        self._prefill_logits = forward.logits
        return self._push(forward, ids, predictions, forward_ms)

    def step(self, forced_id: int | None = None, give_way: IsCancelled = None) -> StepRecord | None:
        """Commit the pending decision (or `forced_id` instead) and run the next forward pass. `give_way()`
        is asked inside the pass (an autoplay step's: a key waits): True sets the step aside (GiveWay),
        the journey and the engine as they were.

        Returns the new pending record, or None once a stop condition holds.
        """
        if self.stop_reason is not None:  # a stop whose reason no longer holds (a larger max, a removed stop
            self.stop_reason = self.check_stop()  # string) goes on
            if self.stop_reason is not None:
                return None
            return self._push(self.engine.forward(self.ids[-1:]), self.ids[-1:])
        if not self.records:
            raise TokenvizError("nothing to step: start a prompt first")
        pending, cached = self.records[-1], self.engine.kv_len
        if forced_id is not None:
            if not 0 <= forced_id < self.engine.info.vocab:
                raise TokenvizError(f"token id {forced_id} is outside the vocabulary (0-{self.engine.info.vocab - 1})")
            self.grammars.check_allows(self.settings, self.generated_ids, forced_id)
            self.records[-1] = self.decision.redecide(self, self.pending_logits, forced_id)
        self.ids.append(self.records[-1].decision.chosen_id)
        self.stop_reason = self.check_stop()
        if self.stop_reason is not None:
            self.pending_logits = None
            return None
        token = self.ids[-1]
        try:
            return self._push(self.engine.forward([token], cancelled=give_way), [token])
        except BaseException as exc:  # the journey stays as it was: no token, the same pending decision
            self.ids.pop()
            self.records[-1], self.stop_reason = pending, None
            self.engine.crop(cached)
            if isinstance(exc, Cancelled):  # only give_way cancels a step
                raise GiveWay("a command is waiting") from None
            raise

    def take_rank(self, rank: int, steps_back: int = 0) -> StepRecord | None:
        """Commit the rank-th most likely token of the model's raw distribution (1-based), `steps_back`
        tokens back: those are rewound first (the path left is kept as a branch)."""
        self.rewind(steps_back)
        pending = self.pending
        if pending is None:
            raise TokenvizError(f"generation has stopped ({self.stop_reason}): rewind first to branch")
        if not 1 <= rank <= len(pending.top):
            raise TokenvizError(f"rank {rank} is outside the top {len(pending.top)}")
        return self.step(forced_id=pending.top[rank - 1].id)

    def rewind(self, n: int = 1) -> int:
        """Undo the last `n` committed tokens; returns how many were undone."""
        n = min(n, len(self.generated_ids))
        if n <= 0:
            return 0
        self._keep_path()
        keep = len(self.generated_ids) - n
        before = self.engine.kv_len
        self.ids = self.ids[: len(self.prompt_ids) + keep]
        self.records = self.records[: keep + 1]
        self.stop_reason = None
        if keep == 0:
            self.engine.crop(len(self.ids))
            self.pending_logits = self._prefill_logits
        else:
            # The cache keeps everything before the last token; feeding it again restores the logits.
            self.engine.crop(len(self.ids) - 1)
            self.pending_logits = self.engine.forward([self.ids[-1]]).logits
        self.last_cache_event = CacheEvent(kept=self.engine.kv_len, dropped=max(before - self.engine.kv_len, 0))
        self.records[-1] = decided_again(self.decision, self, self.pending_logits)
        return n

    def reset(self) -> None:
        """Back to the prompt, keeping its prefill (the path left is kept as a branch)."""
        if self.generated_ids:
            self.rewind(len(self.generated_ids))
        elif self.records:
            self.stop_reason = None
            self.pending_logits = self._prefill_logits
            self.records[-1] = self.decision.redecide(self, self.pending_logits)

    def switch_branch(self, index: int) -> None:
        """Make stored branch `index` the current path; the cache is rebuilt from the shared prefix."""
        if not 0 <= index < len(self.branches):
            raise TokenvizError(f"there is no branch {index + 1}")
        target = self.branches.paths[index]
        self.grammars.check_fits(self.settings, list(target.ids[len(self.prompt_ids) :]), f"branch {index + 1}")
        self._keep_path()
        self.branches.remove(target)
        fed = len(target.ids) - (1 if target.stop_reason else 0)
        keep = min(shared_prefix(self.ids, target.ids), self.engine.kv_len, fed - 1)
        before = self.engine.kv_len
        self.engine.crop(keep)
        forward = self.engine.forward(list(target.ids[keep:fed]))
        self.ids, self.records, self.stop_reason = list(target.ids), list(target.records), target.stop_reason
        self.pending_logits = None if target.stop_reason else forward.logits
        self.last_cache_event = CacheEvent(kept=keep, dropped=max(before - keep, 0))
        if self.pending is not None:
            self.records[-1] = decided_again(self.decision, self, self.pending_logits)
        self.records = with_watched(self)

    def set_settings(self, settings: SamplingSettings) -> None:
        """New settings re-decide the pending step from the logits already computed. A new grammar
        must be one the engine can follow (GrammarMatchers.check) and accept the text generated so far:
        it is refused, in one line, where it does not."""
        self.grammars.check_new(settings, self.settings, self.generated_ids)
        self.settings = settings
        if self.pending is not None:
            self.records[-1] = self.decision.redecide(self, self.pending_logits)

    @property
    def interventions(self) -> tuple[Intervention, ...]:
        return self.intervening.interventions if self.intervening else self.shared_interventions

    def set_interventions(
        self,
        interventions: Sequence[Intervention],
        context: Sequence[int] | None = None,
        progress: Callable[[int, int], None] = lambda done, total: None,
    ) -> None:
        """Change the model while the journey runs: the interventions are resolved on the model's own
        passes (a mean ablation over `context`, by default the journey's tokens), hooked in, and the KV
        cache is fed again under them (`progress`: tokens fed of all), so the pending token is re-decided
        at once. Nothing changes where one is refused."""
        old = self.intervening
        new = None
        interventions = [with_sae(with_branch_source(i, self.branches), self.saes) for i in interventions]
        if interventions:
            engine: Intervenable = require(self.engine, Capability.INTERVENTIONS, interventions[0].label)
            for ablation in (i for i in interventions if isinstance(i, HeadAblation)):
                require(self.engine, Capability.ABLATION, ablation.label)
            with old.suspended() if old else nullcontext():
                new = engine.intervene(
                    interventions,
                    context if context is not None else self.ids,
                    lambda spec: token_of(self.engine, spec, "steer by"),
                )
        if old:
            old.remove()
        self.intervening = new
        self.analyses = JourneyAnalyses(self)  # what the views computed was of the model as it was
        if self.records:
            self._feed_again(progress)

    def pin(
        self,
        ids: Sequence[int],
        progress: Callable[[int, int], None] = lambda done, total: None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        """Follow these tokens at every step: their raw and final probability and raw rank. The
        steps already taken are filled in from their logits, fed again over the cache in chunks:
        `progress(done, total)` follows them, and `cancelled()` stops between them with Cancelled,
        leaving the watched tokens as they were."""
        for token in ids:
            if not 0 <= token < self.engine.info.vocab:
                raise TokenvizError(f"token id {token} is outside the vocabulary (0-{self.engine.info.vocab - 1})")
        if len(set(ids)) > MAX_PINNED:
            raise TokenvizError(f"at most {MAX_PINNED} tokens can be watched at once: unpin one first")
        previous, self.pinned = self.pinned, tuple(dict.fromkeys(ids))
        try:
            self.records = with_watched(self, progress, cancelled)
        except BaseException:
            self.pinned = previous
            raise

    def watch(
        self,
        token: int | str,
        progress: Callable[[int, int], None] = lambda done, total: None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> int:
        """Watch the token `token` names (see journey.watching), or stop watching it if it is
        watched; returns its id. (See pin for `progress` and `cancelled`.)"""
        token_id = token_of(self.engine, token)
        others = [t for t in self.pinned if t != token_id]
        self.pin(others if token_id in self.pinned else [*others, token_id], progress, cancelled)
        return token_id

    def attention(self, rows: range, layers: Sequence[int], cancelled: IsCancelled = None) -> np.ndarray:
        """The exact attention weights of positions `rows` of the current path for `layers`:
        float32 (layers, heads, len(rows), rows.stop); row i covers keys 0..rows.start + i. `cancelled()`
        True sets the pass aside where the runtime can stop it (Cancelled)."""
        if not 0 <= rows.start < rows.stop <= self.engine.kv_len:
            raise TokenvizError(f"positions {rows.start}-{rows.stop - 1} have not all been through the model")
        engine: AttentionRows = require(self.engine, Capability.ATTENTION, "attention rows")
        weights: np.ndarray = to_host({"rows": engine.attention(self.cached_ids, rows, layers, cancelled)})["rows"]
        return weights

    def check_stop(self) -> str | None:
        """Why the journey must stop now, or None."""
        return stop_reason(
            self.ids,
            lambda: self._stops.first(self.settings.stop, self.generated_text),
            len(self.prompt_ids),
            self.settings,
            self.engine.eos_ids,
            self.engine.info.context,
            lambda: self.grammars.complete(self.settings.grammar, self.generated_ids),
        )

    # ---- internals ----------------------------------------------------------------------------

    def _feed_again(self, progress: Callable[[int, int], None]) -> None:
        """Feed the cached tokens again, as the model now is (its interventions changed): the prompt's
        logits for a reset, the pending step's for its decision."""
        cached = self.cached_ids
        self.engine.reset()
        n, begin = len(self.prompt_ids), 0
        while begin < len(cached):  # in chunks, one ending where the prompt does
            progress(begin, len(cached))
            end = min(begin + self.prefill_chunk, n if begin < n else len(cached))
            forward = self.engine.forward(cached[begin:end])
            if end == n:
                self._prefill_logits = forward.logits
            begin = end
        if self.pending is not None:
            self.pending_logits = forward.logits
            self.records[-1] = record_again(self.decision, self, self.pending_logits)

    @property
    def _path(self) -> Branch:
        return Branch(tuple(self.ids), tuple(self.records), self.stop_reason)

    def _keep_path(self) -> None:
        self.branches.keep(self._path, len(self.prompt_ids))

    def score_prompt(self, chunks: int | None = None) -> int:
        """Make the deferred predictions at the prompt's positions, `chunks` of the prefill's chunks at a
        time (all: None); once all are made, the prompt's record (and every branch's copy of it) holds
        them. Returns how many positions are left."""
        made = self.deferred.make(chunks)
        if made is not None and self.records and not self.records[0].prompt_predictions:
            predictions = prompt_predictions(self.engine, to_host(made), self.prompt_ids)
            self.records[0] = dataclasses.replace(self.records[0], prompt_predictions=predictions)
            self.branches.fill_prompt_predictions(predictions, self.records[0].input_ids)
        return self.deferred.left

    def _push(
        self,
        forward: Forward,
        input_ids: list[int],
        prompt_parts: dict[str, torch.Tensor] | None = None,
        forward_ms: float | None = None,
    ) -> StepRecord:
        """Record a forward pass and decide on it: the top-n, the decision (and a prefill's
        predictions at every prompt position) reach the host in one transfer."""
        decided, host = self.decision.record(self, forward.logits, {**(prompt_parts or {}), **(forward.routes or {})})
        self.engine.learn_pieces(input_ids)  # a prompt's pieces: in one call
        record = StepRecord(
            index=len(self.records),
            position=len(self.ids),
            input_ids=tuple(input_ids),
            input_texts=tuple(self.engine.piece(t) for t in input_ids),
            top=decided.top,
            entropy=decided.entropy,
            decision=decided.decision,
            forward_ms=(forward.timer.ms() if forward_ms is None else forward_ms) + decided.ms,
            place_ms=forward.places.ms() if forward.places else (),
            kv_len=self.engine.kv_len,
            kv_bytes=self.engine.kv_bytes,
            prompt_predictions=prompt_predictions(self.engine, host, input_ids) if prompt_parts else (),
            routing=self.engine.read_routing(host),
            interventions=decided.interventions,
            unsteered=decided.unsteered,
        )
        self.pending_logits = forward.logits
        self.records.append(record)
        return record
