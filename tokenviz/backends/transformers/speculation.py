"""Speculative decoding, every round recorded: a cheap drafter proposes tokens, the target model
checks them all in one forward pass, accepts a prefix and replaces the first rejected token.

Drafters draft greedily, so their proposal is deterministic (q is one-hot). The accept/reject rule
is then: accept draft d with probability p(d); on rejection draw from p with d removed. With
greedy settings that means: accept while d is the target's argmax. Either way the output has
exactly the target's distribution, so speculation changes the speed, never the text's law.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import torch

from tokenviz.backends.hf.parts import decoder_layers
from tokenviz.backends.transformers.cache import cache_prefix, full_cache, with_cache
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.results import Round, Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import apply_stages, draw_uniform, inverse_cdf

DRAFT_LEN = 4


class Drafter(Protocol):
    name: str

    def draft(self, ids: list[int], n: int) -> list[int]: ...


class PromptLookup:
    """Propose what followed the last occurrence of the context's final n-gram (n = 3, 2, 1)."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def draft(self, ids: list[int], n: int) -> list[int]:
        for size in range(min(self.max_ngram, len(ids) - 1), 0, -1):
            tail = ids[-size:]
            for start in range(len(ids) - size - 1, -1, -1):
                if ids[start : start + size] == tail:
                    follow = ids[start + size : start + size + n]
                    if follow:
                        return follow
        return []


class CachedDrafter:
    """Greedy drafts from a (smaller) causal LM with its own cache, kept in step with the context."""

    def __init__(self, model: Any, name: str, shared_layers: int | None = None) -> None:
        self.model = model
        self.name = name
        self.shared_layers = shared_layers  # an early exit's: the target's first layers, whose cache it can share
        self.device = next(model.parameters()).device
        self.cache = full_cache()
        self.fed: list[int] = []

    def start_from(self, cache: Any, fed: list[int]) -> None:
        """Go on from `cache`, which holds `fed` (a copy of the target's, for an early exit)."""
        self.cache, self.fed = cache, list(fed)

    @torch.inference_mode()
    def _feed(self, ids: list[int]) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            **with_cache(self.model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        self.fed += ids
        logits: torch.Tensor = out.logits[0, -1]
        return logits

    def draft(self, ids: list[int], n: int) -> list[int]:
        common = 0
        while common < min(len(self.fed), len(ids) - 1) and self.fed[common] == ids[common]:
            common += 1
        if common < len(self.fed):
            if common:
                self.cache.crop(common - len(self.fed))
            else:
                self.cache = full_cache()
            self.fed = self.fed[:common]
        logits = self._feed(ids[common:])
        drafted = []
        for _ in range(n):
            token = int(logits.argmax())
            drafted.append(token)
            if len(drafted) < n:
                logits = self._feed([token])
        return drafted


def early_exit_model(model: Any, layers: int) -> Any:
    """The same model cut after `layers` decoder layers, sharing its weights, then its own final
    norm and unembedding: the early-exit drafter."""
    total = model.config.num_hidden_layers
    if not 1 <= layers < total:
        raise TokenvizError(f"early-exit layer must be 1 to {total - 1}, got {layers}")
    full_layers = decoder_layers(model)
    path = next(name for name, module in model.named_modules() if module is full_layers)  # "model.layers"
    *owners, attribute = path.split(".")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    # Shallow copies down to the module that owns the layers (OPT: model.decoder), so the weights are
    # shared and the target model is left as it is.
    draft = node = _detached_copy(model, config)
    for name in owners:
        child = _detached_copy(node.get_submodule(name), config)
        node._modules[name] = child
        node = child
    node._modules[attribute] = torch.nn.ModuleList(list(full_layers)[:layers])
    return draft


def _detached_copy(module: torch.nn.Module, config: Any) -> torch.nn.Module:
    """A shallow copy with its own table of submodules (and `config`, where it has one). A forward
    set on the instance (a wrapper around the original's) is not copied: it would run the whole model."""
    duplicate = copy.copy(module)
    duplicate.__dict__.pop("forward", None)
    duplicate._modules = dict(module._modules)
    if hasattr(duplicate, "config"):
        duplicate.config = config
    return duplicate


def make_drafter(spec: str, runner: ModelAccess, draft_runner: ModelAccess | None = None) -> Drafter:
    if spec == "prompt-lookup":
        return PromptLookup()
    if spec.startswith("early-exit:"):
        try:
            layers = int(spec.split(":", 1)[1])
        except ValueError:
            raise TokenvizError(f"early-exit needs a layer number, as in early-exit:8; got {spec!r}") from None
        return CachedDrafter(early_exit_model(runner.model, layers), f"early-exit at layer {layers}", layers)
    if spec == "draft-model":
        if draft_runner is None:
            raise TokenvizError("--speculate draft-model needs --draft-model MODEL")
        if draft_runner.info.vocab != runner.info.vocab:
            raise TokenvizError(
                f"the draft model's vocabulary ({draft_runner.info.vocab}) differs from the "
                f"target's ({runner.info.vocab})"
            )
        return CachedDrafter(draft_runner.model, f"draft model {draft_runner.info.name}")
    raise TokenvizError(f"unknown drafter {spec!r}: use prompt-lookup, early-exit:L or draft-model")


def accept_or_replace(probs: torch.Tensor, drafted: int, u_accept: float, u_replace: float) -> tuple[bool, int]:
    """The accept/reject rule for a deterministic draft: accept with probability p(drafted); else
    draw from p with `drafted` removed (renormalised). The result is distributed exactly as p."""
    if u_accept < float(probs[drafted]):
        return True, drafted
    residual = probs.clone()
    residual[drafted] = 0
    total = float(residual.sum())
    if total <= 0:  # p put all its mass on the draft: it is accepted whatever u is
        return True, drafted
    return False, inverse_cdf(residual / total, u_replace)[0]


@torch.inference_mode()
def speculative_decode(
    runner: ModelAccess,
    prompt_ids: list[int],
    drafter: Drafter,
    max_new_tokens: int,
    settings: SamplingSettings,
    draft_len: int = DRAFT_LEN,
    cancelled: Callable[[], bool] = lambda: False,
    from_cache: bool = False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Speculation:
    """`cancelled()` is asked before each round; a True ends the run with Cancelled. With
    `from_cache`, the runner's cache holds at least `prompt_ids[:-1]`: a copy of it is the start."""
    refuse_grammar(settings.grammar, "speculative decoding")
    model, device = runner.model, runner.device
    ids = list(prompt_ids)
    start = len(ids)
    cache = cache_prefix(runner.cache, len(ids) - 1) if from_cache else full_cache()
    if from_cache and isinstance(drafter, CachedDrafter) and drafter.shared_layers:
        drafter.start_from(cache_prefix(runner.cache, len(ids) - 1, layers=drafter.shared_layers), ids[:-1])
    if len(ids) > 1 and not from_cache:  # the target's cache always holds everything but the last token
        model(
            input_ids=torch.tensor([ids[:-1]], device=device),
            **with_cache(model, cache),
            use_cache=True,
            logits_to_keep=1,
        )
    rounds = []
    while len(ids) - start < max_new_tokens:
        progress(len(ids) - start, max_new_tokens)
        if cancelled():
            raise Cancelled("speculative decoding cancelled")
        room = min(draft_len, max_new_tokens - (len(ids) - start) - 1)
        drafted = drafter.draft(ids, room) if room > 0 else []
        feed = [ids[-1], *drafted]
        logits = model(
            input_ids=torch.tensor([feed], device=device),
            **with_cache(model, cache),
            use_cache=True,
            logits_to_keep=len(feed),
        ).logits[0]
        accepted, rejected_at, new = 0, None, list[int]()
        for i in range(len(feed)):
            context = ids + new
            stages = apply_stages(logits[i], settings, context, context[start:])
            scores = stages[-1][2][0] if stages else logits[i].float()
            position = len(context)
            if settings.greedy:
                target = int(scores.argmax())
                ok = i < len(drafted) and drafted[i] == target
            elif i < len(drafted):
                ok, target = accept_or_replace(
                    torch.softmax(scores, -1),
                    drafted[i],
                    draw_uniform(settings.seed, position),
                    draw_uniform(settings.seed + 1, position),
                )
            else:
                ok, target = False, inverse_cdf(torch.softmax(scores, -1), draw_uniform(settings.seed, position))[0]
            if ok:
                accepted += 1
                new.append(target)
                continue
            if i < len(drafted):
                rejected_at = i
            new.append(target)
            break
        rounds.append(Round(drafted=tuple(drafted), accepted=accepted, next_id=new[-1], rejected_at=rejected_at))
        ids += new
        if cache.get_seq_length() > len(ids) - 1:  # drop what the rejected drafts left in the cache
            cache.crop(len(ids) - 1 - cache.get_seq_length())
        eos = next((k for k, t in enumerate(ids[start:]) if t in runner.eos_ids), None)
        if eos is not None:
            ids = ids[: start + eos + 1]
            break
    texts = {t: runner.piece(t) for r in rounds for t in (*r.drafted, r.next_id)}
    return Speculation(
        drafter=drafter.name, rounds=tuple(rounds), ids=tuple(ids[start : start + max_new_tokens]), texts=texts
    )
