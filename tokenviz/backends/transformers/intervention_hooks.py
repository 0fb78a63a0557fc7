"""Interventions as plain PyTorch hooks on the model: a head's output replaced before the attention
output projection (a forward pre-hook on that projection); a direction added to a decoder layer's
output at every position, or that output replaced at one position, or moved at every position so an
SAE's feature holds its clamped value (forward hooks on the layer).
With none in force, no hook is left on the model: a step does exactly what it does without this
module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

import torch

from tokenviz.backends.shared.parts import decoder_layers, last_logits
from tokenviz.backends.shared.resolving import patch_source_ids, scaled_vector
from tokenviz.backends.shared.steering_direction import steering_direction as shared_direction
from tokenviz.backends.transformers.cache import passed_cache
from tokenviz.contract.errors import SettingsError
from tokenviz.contract.interventions import (
    FeatureClamp,
    FeatureSteering,
    HeadAblation,
    Intervention,
    Patch,
    Steering,
    Suspendable,
)
from tokenviz.features.feature_edits import Clamp, feature_vector
from tokenviz.tensors.transfer import ids_to_device

OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "c_proj", "dense", "wo")  # the families' names for it


def output_projection(layer: torch.nn.Module) -> torch.nn.Module:
    """The decoder layer's attention output projection: its input is every head's output, side by side."""
    for name, module in layer.named_modules():
        path = name.split(".")
        if path[-1] in OUTPUT_PROJECTIONS and any("attn" in part or "attention" in part for part in path[:-1]):
            found: torch.nn.Module = module
            return found
    raise SettingsError("this model's attention output projection is not one tokenviz knows: no head can be ablated")


def _first(output: Any) -> torch.Tensor:
    tensor: torch.Tensor = output[0] if isinstance(output, tuple) else output
    return tensor


@torch.inference_mode()
def residual_after(model: Any, layer: int, ids: Sequence[int]) -> torch.Tensor:
    """The residual stream after decoder layer `layer` at the last of `ids`, read alone (no cache)."""
    seen: list[torch.Tensor] = []
    handle = decoder_layers(model)[layer].register_forward_hook(lambda m, a, out: seen.append(_first(out)[0, -1]))
    try:
        device = next(model.parameters()).device
        model(input_ids=ids_to_device(ids, device), use_cache=False, logits_to_keep=last_logits(len(ids), device))
    finally:
        handle.remove()
    return seen[0].float()


@torch.inference_mode()
def head_outputs_mean(model: Any, layer: int, heads: int, ids: Sequence[int]) -> torch.Tensor:
    """Every head's output at `layer`, before the output projection, averaged over the positions of
    `ids`: (heads, width)."""
    seen: list[torch.Tensor] = []
    projection = output_projection(decoder_layers(model)[layer])
    handle = projection.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].float().mean(0)))
    try:
        device = next(model.parameters()).device
        model(input_ids=ids_to_device(ids, device), use_cache=False, logits_to_keep=last_logits(len(ids), device))
    finally:
        handle.remove()
    return seen[0].reshape(heads, -1)


@torch.inference_mode()
def residual_at(model: Any, layer: int, ids: Sequence[int], position: int | list[int]) -> torch.Tensor:
    """The residual stream after decoder layer `layer` at `position` of `ids` (a position they have, see
    backends.shared.resolving; several: one row each), read alone (no cache)."""
    seen: list[torch.Tensor] = []
    handle = decoder_layers(model)[layer].register_forward_hook(lambda m, a, out: seen.append(_first(out)[0]))
    try:
        device = next(model.parameters()).device
        model(input_ids=ids_to_device(ids, device), use_cache=False, logits_to_keep=last_logits(len(ids), device))
    finally:
        handle.remove()
    return seen[0][position].float()


def steering_direction(
    model: Any, steering: Steering, encode: Callable[[str], list[int]], token_id: Callable[[str], int]
) -> torch.Tensor:
    """The direction `steering` adds (before its scale), as every backend's (backends.shared.steering_direction).
    `token_id` turns a token's text (or id:N) into its id."""

    def head_rows(toward: str, away: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = model.get_output_embeddings().weight[[token_id(toward), token_id(away)]].float()
        return rows[0], rows[1]

    return shared_direction(steering, head_rows, lambda text: residual_after(model, steering.layer, encode(text)))


@dataclass(frozen=True)
class Resolved:
    """An intervention with what its hook needs: an ablated head's replacement (None: zero), a steering's
    scaled direction, or a clamp's moving of residuals."""

    intervention: Intervention
    value: torch.Tensor | None
    clamp: Clamp | None = None


def resolve(
    model: Any,
    heads: int,
    interventions: Sequence[Intervention],
    context: Sequence[int],
    encode: Callable[[str], list[int]],
    token_id: Callable[[str], int],
) -> list[Resolved]:
    """Each intervention with its value, computed from the model's own forward passes (no hook in force):
    a mean over `context` for a mean ablation, the direction for a steering."""
    resolved = []
    for i in interventions:
        match i:
            case HeadAblation():
                if i.mean and not context:
                    raise SettingsError(f"{i.label} is a mean over the journey's tokens: start a journey first")
                value = head_outputs_mean(model, i.layer, heads, context)[i.head] if i.mean else None
            case Patch():
                ids = patch_source_ids(i, encode)
                value = residual_at(model, i.layer, ids, i.position)
            case Steering():
                value = i.scale * steering_direction(model, i, encode, token_id)
            case FeatureSteering():
                value = torch.from_numpy(scaled_vector(i, feature_vector(i).numpy()))
            case FeatureClamp():
                resolved.append(Resolved(i, None, Clamp(i)))
                continue
            case _:
                assert_never(i)
        resolved.append(Resolved(i, value))
    return resolved


class Hooks(Suspendable):
    """The interventions in force on a model, as hooks; `suspended()` runs the model's own."""

    def __init__(self, model: Any, heads: int, resolved: Sequence[Resolved]):
        self.active = True
        self._handles: list[Any] = []
        self._start = 0  # the position of the first token the pass in progress feeds
        layers = decoder_layers(model)
        if any(isinstance(r.intervention, Patch) for r in resolved):
            self._handles.append(model.register_forward_pre_hook(self._note_start, with_kwargs=True))
        for r in resolved:
            i = r.intervention
            assert i is not None
            match i:
                case HeadAblation():
                    hook = self._ablation(i.head, heads, r.value)
                    self._handles.append(output_projection(layers[i.layer]).register_forward_pre_hook(hook))
                case Patch():
                    assert r.value is not None
                    self._handles.append(layers[i.layer].register_forward_hook(self._patch(i.position, r.value)))
                case Steering() | FeatureSteering():
                    assert r.value is not None
                    self._handles.append(layers[i.layer].register_forward_hook(self._steering(r.value)))
                case FeatureClamp():
                    assert r.clamp is not None
                    self._handles.append(layers[i.layer].register_forward_hook(self._clamp(r.clamp)))
                case _:
                    assert_never(i)

    def _ablation(self, head: int, heads: int, value: torch.Tensor | None) -> Callable[..., Any]:
        def pre_hook(module: torch.nn.Module, args: Any) -> Any:
            if not self.active:
                return None
            x = args[0]
            width = x.shape[-1] // heads
            x = x.clone()
            x[..., head * width : (head + 1) * width] = 0 if value is None else value.to(x.device, x.dtype)
            return (x, *args[1:])

        return pre_hook

    def _steering(self, value: torch.Tensor) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            if not self.active:
                return None
            hidden = _first(output)
            steered = hidden + value.to(hidden.device, hidden.dtype)
            return (steered, *output[1:]) if isinstance(output, tuple) else steered

        return hook

    def _clamp(self, clamp: Clamp) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            if not self.active:
                return None
            clamped = clamp(_first(output))
            return (clamped, *output[1:]) if isinstance(output, tuple) else clamped

        return hook

    def _note_start(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """Where the pass starts: after what its cache holds (a pass without one starts at 0)."""
        cache = passed_cache(kwargs)
        self._start = cache.get_seq_length() if cache is not None else 0

    def _patch(self, position: int, value: torch.Tensor) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            hidden = _first(output)
            at = position - self._start
            if not self.active or not 0 <= at < hidden.shape[1]:
                return None
            patched = hidden.clone()
            patched[:, at] = value.to(hidden.device, hidden.dtype)
            return (patched, *output[1:]) if isinstance(output, tuple) else patched

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
