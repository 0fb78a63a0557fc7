"""One model, one DynamicCache: prefill, feed one token, crop. Not thread-safe by design:
exactly one thread (the engine thread, or a script) may own a runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from tokenviz.backends.shared.output_head import final_norm, head_logits, stream_merge
from tokenviz.backends.shared.parts import eos_id_set, last_logits, output_layer_input
from tokenviz.backends.shared.routes import join_routes, read_routing
from tokenviz.backends.shared.token_texts import TokenPieces
from tokenviz.backends.transformers.attention import Capture, capturing, latent_attention
from tokenviz.backends.transformers.cache import crop_layers, cut_cache, full_cache, with_cache
from tokenviz.backends.transformers.chat import chat_ids, has_chat_template
from tokenviz.backends.transformers.compiled_step import CompiledStep
from tokenviz.backends.transformers.device_map import input_device
from tokenviz.backends.transformers.device_map_times import PlaceTimes, timed_by_place
from tokenviz.backends.transformers.exact_attention import ExactAttention
from tokenviz.backends.transformers.head_check import check_head, head_reproduces, output_layer, settle_head
from tokenviz.backends.transformers.interrupt import layer_by_layer
from tokenviz.backends.transformers.intervention_hooks import residual_at
from tokenviz.backends.transformers.lens import layer_streams, stacked
from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.routing import recording, route_tensors, routers, shared_gates
from tokenviz.backends.transformers.step_lens import StepLens
from tokenviz.contract.engine import (
    WHOLE_VOCABULARY,
    AttentionRows,
    Attributing,
    Caching,
    Capability,
    ChatIds,
    Engine,
    Forward,
    FullScores,
    Intervenable,
    IsCancelled,
    Lens,
    LensOfScores,
    LogitSplitting,
    OnProgress,
    Residuals,
    ResidualStream,
    SearchAsk,
    TimesByPlace,
    in_order,
)
from tokenviz.contract.errors import Cancelled, ModelLoadError, TokenvizError
from tokenviz.contract.interventions import Intervention
from tokenviz.contract.records import ModelInfo, Routing
from tokenviz.contract.results import BeamResult, Inspection, LensAsk, LogitDifference, Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.prompt_predictions import predict_positions
from tokenviz.tensors.transfer import DeviceTimer, ids_to_device

if TYPE_CHECKING:
    from tokenviz.backends.transformers.interventions_in_force import InterventionState


def _no_progress(done: int, total: int) -> None:
    pass


def _not_cancelled() -> bool:
    return False


@dataclass
class RunnerForward:
    """What one forward pass produced, still on the model's device: the caller copies what it
    needs to the host in one transfer (see tokenviz.tensors.transfer)."""

    logits: torch.Tensor  # (vocab,): after the last token fed
    timer: DeviceTimer
    position_logits: torch.Tensor | None = None  # (tokens fed, vocab), when every position's were asked for
    routes: dict[str, torch.Tensor] | None = None  # an MoE model's routing of the tokens fed (see model.routing)
    places: PlaceTimes | None = None  # a spread model's time in each place its weights live
    # Instead of position_logits: what the output layer reads at every position (tokens fed, hidden) and
    # the output layer itself, run when the predictions are asked for (a prefill's, deferred).
    hidden: torch.Tensor | None = None
    head: Callable[[torch.Tensor], torch.Tensor] | None = None

    def predictions(self, next_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """What the model predicted after each position fed, of `next_ids` (see predict_positions): from
        the logits kept, or the output layer run now over the hidden states kept, a slice at a time."""
        if self.position_logits is not None:
            return predict_positions(self.position_logits, next_ids)
        assert self.hidden is not None and self.head is not None, "every position's logits were not asked for"
        rows = max(1, HEAD_SLICE_NUMBERS // self.logits.numel())
        parts = [
            predict_positions(self.head(self.hidden[i : i + rows]), next_ids[i : i + rows])
            for i in range(0, max(len(next_ids), 1), rows)
        ]
        return parts[0] if len(parts) == 1 else {k: torch.cat([part[k] for part in parts]) for k in parts[0]}


# Where a pass cancelled with no progress to tell (an autoplay step giving way to a key: Session.step) asks:
# so many layers spread through the pass, not every one, since each hook costs the step its call (a step
# of the bundled model on a CPU: 0.7 ms with all 30 layers asked, nothing measurable with 4), and a key
# then waits at most a quarter of a step.
CANCEL_POINTS = 4
HEAD_SLICE_NUMBERS = 2**24  # logits made at once from the kept hidden states (64 MB of float32)


def cache_layers(key_addresses: dict[int, int], cache: Any, layers: int) -> list[int | None]:
    """For each decoder layer, the cache layer that holds the keys it attends over: itself, or where
    a model's later layers share an earlier layer's keys (Gemma 3n keeps fewer cache layers than it
    has layers), the cache layer whose storage its keys were, as one forward pass found them (None
    where none was)."""
    if len(cache.layers) == layers:
        return list(range(layers))
    held = {layer.keys.data_ptr(): index for index, layer in enumerate(cache.layers)}
    return [held.get(key_addresses.get(layer, -1)) for layer in range(layers)]


@torch.inference_mode()
def measured_shape(model: Any, device: torch.device, info: ModelInfo) -> tuple[ModelInfo, int, list[int | None]]:
    """`info` with the key/value heads and head size the KV cache really holds, from a one-token
    forward pass: configs name them in many ways (grouped- and multi-query, Falcon's num_kv_heads,
    a latent under multi-head latent attention). The same pass measures one position's query states,
    every layer's, as the attention view keeps them (their bytes), and which cache layer holds each
    layer's keys (see cache_layers). It runs in the thread that owns the runner: on a CPU, a thread
    that runs the model first keeps its speed, and the app's engine thread is that thread."""
    cache = full_cache()
    with capturing() as capture:
        model(
            input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), **with_cache(model, cache), use_cache=True
        )
    keys = getattr(cache.layers[0], "keys", None)
    if not isinstance(keys, torch.Tensor):
        raise ModelLoadError(f"{type(model).__name__} keeps no key/value cache that tokenviz can read")
    query_bytes = sum(q.numel() * q.element_size() for q in capture.queries.values())
    shaped = dataclasses.replace(
        info, kv_heads=int(keys.shape[1]), head_dim=int(keys.shape[-1]), latent_kv=latent_attention(model)
    )
    return shaped, query_bytes, cache_layers(capture.key_addresses, cache, info.layers)


class ModelRunner:
    """The transformers backend's engine: every capability of contract.engine."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded  # another runner may share its weights: a comparison on one model
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = input_device(self.model)  # a device-mapped model's first parameters may be on the disk
        info = dataclasses.replace(loaded.info, chat_template=has_chat_template(loaded.tokenizer))
        self.info, query_bytes, held = measured_shape(self.model, self.device, info)
        self.cache = full_cache()
        self.rows = ExactAttention(self, query_bytes, held)  # the attention view's rows, exact
        self.step_lens = StepLens()  # the lens's rows of the last steps, read in their own passes
        self.routers = routers(self.model)  # an MoE model's, by layer (none: dense)
        self.shared_gates = shared_gates(self.model, self.routers)
        self.info = dataclasses.replace(
            self.info,
            queries_kept=self.rows.kept(),
            capabilities=in_order(Capability),
            distribution=WHOLE_VOCABULARY,
        )
        self.special_ids = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        self.eos_ids = eos_id_set(self.model.generation_config.eos_token_id, self.tokenizer)
        self.pieces = TokenPieces(self.tokenizer)  # see tokenviz.backends.shared.token_texts
        self.compiled: CompiledStep | None = loaded.compiled  # (--compile) shared with the model's other runners

    def piece(self, token_id: int) -> str:
        return self.pieces.piece(token_id)

    def chat_ids(self, user: str, system: str | None = None) -> ChatIds:
        """The conversation's ids through the tokenizer's chat template (see tokenviz.backends.transformers.chat)."""
        return chat_ids(self.tokenizer, user, system)

    def twin(self) -> ModelRunner:
        """Another runner on the same weights, with a cache of its own (a comparison on one model)."""
        return ModelRunner(self.loaded)

    def joined(
        self, last: Forward, routes: Sequence[dict[str, torch.Tensor]], places: Sequence[TimesByPlace]
    ) -> RunnerForward:
        """The last of several passes over one prompt (a prefill's chunks), with every pass's routing
        and time in each place joined in order of position."""
        assert isinstance(last, RunnerForward), "a pass of this runner's"
        return dataclasses.replace(
            last,
            routes=join_routes(list(routes)) if routes else last.routes,
            places=PlaceTimes.joined([p for p in places if isinstance(p, PlaceTimes)]) if places else last.places,
        )

    def read_routing(self, host: dict[str, np.ndarray]) -> Routing | None:
        """The routing in a step's transfer, by this model's router layers (None for a dense model)."""
        return read_routing(host, sorted(self.routers))

    # ---- the internals (contract.engine's Lens, Attributing, LogitSplitting, Intervenable) ---------------

    def inspect(self, ask: LensAsk) -> list[Inspection]:
        from tokenviz.backends.transformers.lens import inspect_positions

        return inspect_positions(
            self, list(ask.ids), list(ask.positions), list(ask.chosen), pinned=ask.pinned, rows=ask.rows
        )

    def attribute(
        self, ids: list[int], target: int, method: str, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[float, list[float]]:
        from tokenviz.backends.transformers.attribution import attribute

        return attribute(self, ids, target, method, progress or _no_progress, cancelled or _not_cancelled)

    def logit_difference(
        self, ids: list[int], a: int, b: int, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> LogitDifference:
        from tokenviz.backends.transformers.logit_difference import logit_difference

        return logit_difference(self, ids, a, b, progress, cancelled or _not_cancelled)

    def beam_search(self, ask: SearchAsk, width: int) -> BeamResult:
        from tokenviz.backends.transformers.beams import beam_search

        ids, told = list(ask.ids), ask.tell
        return beam_search(
            self, ids, width, ask.steps, cancelled=ask.is_cancelled, from_cache=ask.from_cache, progress=told
        )

    def speculate(
        self, ask: SearchAsk, drafter: str, settings: SamplingSettings, draft: Engine | None = None
    ) -> Speculation:
        """Speculative decoding from `ask.ids`, drafted as `drafter` says (see speculation.make_drafter)."""
        from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode

        if draft is not None and not isinstance(draft, ModelRunner):
            raise TokenvizError(f"a draft model runs here in transformers, beside the target: not {draft.info.runtime}")
        drafting = make_drafter(drafter, self, draft)
        return speculative_decode(
            self,
            list(ask.ids),
            drafting,
            ask.steps,
            settings,
            cancelled=ask.is_cancelled,
            from_cache=ask.from_cache,
            progress=ask.tell,
        )

    def intervene(
        self, interventions: Sequence[Intervention], context: Sequence[int], token_id: Callable[[str], int]
    ) -> InterventionState:
        """The interventions resolved on this model's own passes (a mean ablation over `context`) and
        hooked in, with the model's own distribution kept beside them (see interventions_in_force)."""
        from tokenviz.backends.transformers.interventions_in_force import InterventionState

        return InterventionState(self, interventions, context, token_id)

    def learn_pieces(self, ids: Iterable[int]) -> None:
        self.pieces.learn(ids)

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """The text's token ids; with `special_tokens` those the tokenizer adds to a whole text (a BOS)."""
        return list(self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"])

    def decode(self, ids: Iterable[int]) -> str:
        return self.pieces.decode(ids)

    @property
    def kv_len(self) -> int:
        return self.cache.get_seq_length()

    @property
    def kv_bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    def reset(self) -> None:
        self.use_cache(full_cache())

    def use_cache(self, cache: Any) -> None:
        """Go on from `cache` (a fresh one, or one kept from before): nothing kept about the old one holds."""
        self.cache = cache
        self.rows.forget_from(0)
        self.step_lens.forget_from(0)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of every layer of the cache (see crop_layers)."""
        if self.kv_len < length:
            raise ValueError(f"cannot crop a cache of {self.kv_len} up to {length}")
        if length == 0:
            self.reset()
            return
        crop_layers(self.cache, length)
        self.rows.forget_from(length)
        self.step_lens.forget_from(length)

    @torch.inference_mode()
    def forward(
        self, ids: list[int], every_position: bool = False, cancelled: IsCancelled = None, progress: OnProgress = None
    ) -> RunnerForward:
        """Feed `ids` after what the cache holds; return the next-token logits, and with
        `every_position` the logits after each of `ids`. Their query states are kept for the attention
        view. Nothing waits for the device. `cancelled` and `progress` are asked and told between the
        decoder layers (a prefill's chunk: see interrupt.layer_by_layer); Cancelled leaves the cache
        holding part of the pass, for the caller to undo."""
        timer = DeviceTimer(self.device)
        start = self.kv_len
        lens = self.step_lens.reads_rows(len(ids)) and not every_position
        if not lens and self._compiled_serves(ids, every_position):
            assert self.compiled is not None
            logits, queries = self.compiled.step(self.cache, ids_to_device(ids, self.device))
            self.rows.queries.add(start, Capture(queries=queries))
            return RunnerForward(logits=logits, timer=timer.stop())
        yielding: Any = nullcontext()
        if cancelled or progress:  # a step's cancel, with no progress to tell, asks before a few layers
            points = None if progress else CANCEL_POINTS
            yielding = layer_by_layer(self.model, cancelled or _not_cancelled, progress, what="the pass", points=points)
        # Every position's predictions: the hidden states the output layer reads are kept, its logits made
        # when asked for (a prefill's, deferred), where the output layer run again gives the model's own.
        keep_hidden = every_position and head_reproduces(self.model) is not False
        with (
            capturing(calls=self.rows.queries.calls, keep_last=self.rows.queries.positions) as capture,
            yielding,
            recording(self.routers, self.shared_gates) as routed,
            timed_by_place(self.model) as places,
            output_layer_input(self.model) if keep_hidden else nullcontext() as read,
            layer_streams(self.model) if lens else nullcontext() as streams,
        ):
            input_ids = ids_to_device(ids, self.device)
            out = self.model(
                input_ids=input_ids,
                **with_cache(self.model, self.cache),
                use_cache=True,
                logits_to_keep=last_logits(len(ids), self.device)
                if keep_hidden
                else (len(ids) if every_position else 1),
            )
        self.rows.queries.add(start, capture, fed=len(ids))
        if streams is not None:
            with suppress(TokenvizError):  # layers the lens cannot follow: its own pass says so, the step goes on
                self.step_lens.keep(start, ids[0], stacked(self.model, input_ids, streams), out.logits[0, -1])
        hidden = read[-1][0] if keep_hidden and read else None  # (tokens fed, hidden)
        reproduces = head_reproduces(self.model)
        if keep_hidden and reproduces is None:  # checked once, on the last position
            reproduces = check_head(self.model, hidden[-1:], out.logits[0, -1:]) if hidden is not None else False
            settle_head(self.model, reproduces)
        if keep_hidden and not reproduces:  # (a family whose output layer does more): every position's
            self.crop(start)  # logits, from the same cache as before this pass
            return self.forward(ids, every_position=True)
        return RunnerForward(
            logits=out.logits[0, -1],
            timer=timer.stop(),
            position_logits=out.logits[0] if every_position and hidden is None else None,
            routes=route_tensors(routed) if routed and len(routed) == len(self.routers) else None,  # all read
            places=places,
            hidden=hidden,
            head=output_layer(self.model) if hidden is not None else None,
        )

    def _compiled_serves(self, ids: list[int], every_position: bool) -> bool:
        """Whether the compiled step can feed `ids`: one token whose pass needs no hook (an
        intervention's, an MoE router's reading), since a compiled graph runs none."""
        return (
            self.compiled is not None
            and len(ids) == 1
            and not every_position
            and not self.routers
            and len(self.cache.layers) == self.info.layers
            and self.compiled.serves(self.cache)
            and not self.compiled.hooked()
        )

    def attention(
        self, ids: Sequence[int], rows: range, layers: Sequence[int], cancelled: IsCancelled = None
    ) -> torch.Tensor:
        """The exact attention weights of positions `rows` of the cached path `ids`, for `layers`:
        (layers, heads, len(rows), rows.stop) in float32, on the device (see exact_attention). (`cancelled`
        is asked before: the rows are one computation.)"""
        if cancelled is not None and cancelled():
            raise Cancelled("the attention rows were set aside")
        return self.rows.weights(ids, rows, layers)

    def residual(self, ids: Sequence[int], positions: Sequence[int], layer: int) -> torch.Tensor:
        """The residual after decoder layer `layer` at `positions`: at the step just taken, from that step's
        own pass where it kept its stream (step_lens: asking marks the next steps to keep theirs, so the
        features view costs an SAE's encode a step); else one pass of `ids` up to the last of them read
        alone (no cache), the interventions' hooks in force (intervention_hooks.residual_at)."""
        self.step_lens.asked()
        kept = self.step_lens.at(ids, positions) if stream_merge(self.model) is None else None
        if kept is not None:  # (layers + 1, 1, hidden): the embeddings, then each layer's output
            return kept[0][layer + 1].float()
        return residual_at(self.model, layer, list(ids[: max(positions) + 1]), list(positions))

    @torch.inference_mode()
    def through_head(self, vectors: torch.Tensor) -> torch.Tensor:
        """`vectors` through the model's own final norm and head (its logit scaling and soft-cap too)."""
        x = vectors.to(self.device, self.model.dtype)
        return head_logits(self.model, final_norm(self.model)(x)).float()

    @torch.inference_mode()
    def logits_after(self, ids: Sequence[int], start: int) -> torch.Tensor:
        """The next-token logits after each of `ids[start:]` (positions the cache holds), fed again
        over the cache cut at `start`; the cache is left as it was. (positions, vocab)."""
        with cut_cache(self.cache, start):
            out = self.model(
                input_ids=ids_to_device(ids[start:], self.device),
                **with_cache(self.model, self.cache),
                use_cache=True,
                logits_to_keep=len(ids) - start,
            )
        logits: torch.Tensor = out.logits[0]
        return logits

    @torch.inference_mode()
    def full_scores(self, ids: Sequence[int], first: int) -> torch.Tensor:
        """One pass over `ids` alone, without a cache (the runner's untouched): the logits after each of
        `ids[first:]` in float32, (positions, vocab)."""
        out = self.model(input_ids=ids_to_device(ids, self.device), use_cache=False, logits_to_keep=len(ids) - first)
        logits: torch.Tensor = out.logits[0].float()
        return logits

    @torch.inference_mode()
    def full_scores_kept(self, ids: Sequence[int], first: int) -> tuple[torch.Tensor, Residuals]:
        """full_scores, and the lens's residual stream at the same positions, captured in the same pass."""
        from tokenviz.backends.transformers.lens import layer_streams, stacked

        input_ids = ids_to_device(ids, self.device)
        with layer_streams(self.model) as captured:
            out = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=len(ids) - first)
        logits: torch.Tensor = out.logits[0].float()
        stream = stacked(self.model, input_ids, captured)[:, first:]
        return logits, Residuals(stream, tuple(ids[first:]), logits)

    @torch.inference_mode()
    def lens_of(self, kept: Residuals, chosen: Sequence[int]) -> list[Inspection]:
        from tokenviz.backends.transformers.lens import inspect_positions_of

        here = list(range(len(kept.tokens)))
        tokens, last = list(kept.tokens), kept.scores[-1]
        return inspect_positions_of(self, kept.stream, last, tokens, here, list(chosen), 3, 16, (), None)

    recomputed_as = "the whole context again in eager attention, without the cache"

    @torch.inference_mode()
    def recompute(
        self, ids: list[int], chunk: int | None = None, progress: OnProgress = None, cancelled: IsCancelled = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole of `ids` again in the model's eager attention, independent of the runner's cache
        (which is untouched): the next-token logits and the last position's attention row of every
        layer, (layers, heads, len(ids)) in float32. With `chunk`, the context goes in chunks of that
        many tokens over a fresh cache (`progress(done, total)` after each, `cancelled()` asked before
        each): a long context's weights are then one chunk's rows, not the whole square."""
        progress, cancelled = progress or _no_progress, cancelled or _not_cancelled
        step = chunk or len(ids)
        last = (len(ids) - 1) // step * step  # where the last chunk begins
        cache = full_cache()
        with capturing(eager=True):
            for begin in range(0, last, step):
                if cancelled():
                    raise Cancelled("the recompute was cancelled")
                self.model(
                    input_ids=ids_to_device(ids[begin : begin + step], self.device),
                    **with_cache(self.model, cache),
                    use_cache=True,
                    logits_to_keep=1,
                )
                progress(begin + step, len(ids))
            if cancelled():
                raise Cancelled("the recompute was cancelled")
            out = self.model(
                input_ids=ids_to_device(ids[last:], self.device),
                **with_cache(self.model, cache if last else None),
                use_cache=bool(last),
                output_attentions=True,
                logits_to_keep=1,
            )
        return out.logits[0, -1], torch.cat([layer[:, :, -1, :].float() for layer in out.attentions], 0)


def conforms(runner: ModelRunner) -> tuple[
    Engine, Caching, AttentionRows, Lens, Attributing, LogitSplitting, Intervenable, FullScores, LensOfScores,
    ResidualStream,
]:  # fmt: skip
    """The contract's protocols a runner declares (Capability: all of them), checked by mypy here."""
    return runner, runner, runner, runner, runner, runner, runner, runner, runner, runner
