"""Speculative decoding on a transformers model (the rounds: tokenviz.decoding.speculation): the target's
passes over a cache of its own, and the drafters that are models: an early exit of the target (its first
layers, their cache shared) or a draft model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.cache import cache_prefix, full_cache, with_cache
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.commands import DEFAULT_DRAFTER
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.grammar import refuse_grammar
from tokenviz.contract.results import Speculation
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.speculation import DRAFT_LEN, Drafter, PromptLookup, speculate_over


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
    if spec == DEFAULT_DRAFTER:  # the model's own middle layer drafts on any text (prompt lookup needs repeats)
        layers = runner.info.layers
        spec = f"early-exit:{layers // 2}" if layers > 1 else "prompt-lookup"
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


class _ModelPasses:
    """The target's passes: the model over a cache of its own (a copy of the runner's, `from_cache`)."""

    def __init__(self, runner: ModelAccess, ids: list[int], from_cache: bool):
        self.model, self.device = runner.model, runner.device
        self.cache = cache_prefix(runner.cache, len(ids) - 1) if from_cache else full_cache()
        if len(ids) > 1 and not from_cache:  # the target's cache always holds everything but the last token
            self.model(
                input_ids=torch.tensor([ids[:-1]], device=self.device),
                **with_cache(self.model, self.cache),
                use_cache=True,
                logits_to_keep=1,
            )

    def verify(self, feed: list[int]) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([feed], device=self.device),
            **with_cache(self.model, self.cache),
            use_cache=True,
            logits_to_keep=len(feed),
        )
        logits: torch.Tensor = out.logits[0]
        return logits

    def keep(self, length: int) -> None:
        if self.cache.get_seq_length() > length:
            self.cache.crop(length - self.cache.get_seq_length())


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
    """With `from_cache`, the runner's cache holds at least `prompt_ids[:-1]`: a copy of it is the start."""
    refuse_grammar(settings.grammar, "speculative decoding")  # before any pass
    ids = list(prompt_ids)
    if from_cache and isinstance(drafter, CachedDrafter) and drafter.shared_layers:
        drafter.start_from(cache_prefix(runner.cache, len(ids) - 1, layers=drafter.shared_layers), ids[:-1])
    passes = _ModelPasses(runner, ids, from_cache)
    eos, piece = runner.eos_ids, runner.piece
    return speculate_over(passes, ids, drafter, max_new_tokens, settings, eos, piece, draft_len, cancelled, progress)
