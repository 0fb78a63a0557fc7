"""Which experts a mixture-of-experts model's routers chose, as the routers returned them.

transformers 5's MoE families (Mixtral, Qwen MoE, OLMoE, DeepSeek V3, gpt-oss, Granite MoE, ...)
route through a `*TopKRouter` module in each MoE layer that returns (logits, weights, indices):
the chosen experts and their weights per token, after whatever the family does (a softmax and a
renormalisation, DeepSeek's group limit and correction bias, gpt-oss's softmax over the top-k).
Llama 4's router returns (every expert's score, logits) instead: its top-k of the logits, with
their scores, are the same choice.
Forward hooks read exactly those, and the router's entropy from its logits, during the forward
passes the journey runs anyway: no pass of its own. A dense model has no routers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from tokenviz.backends.shared.parts import decoder_layers


def routers(model: Any) -> dict[int, torch.nn.Module]:
    """Each MoE layer's router, by decoder layer: the first module in the layer named ...Router
    (TopKRouter, TopkRouter) that keeps a top-k. Empty for a dense model."""
    found = {}
    for index, layer in enumerate(decoder_layers(model)):
        for module in layer.modules():
            if type(module).__name__.lower().endswith("router") and hasattr(module, "top_k"):
                found[index] = module
                break
    return found


SHARED_NAMES = ("shared_expert", "shared_experts")  # Qwen MoE and Llama 4; DeepSeek
SHARED_GATE = "shared_expert_gate"  # Qwen MoE scales its shared expert by sigmoid(gate(x)) per token


def shared_gates(model: Any, found: dict[int, torch.nn.Module]) -> dict[int, torch.nn.Module | None]:
    """For each MoE layer with a shared expert (one every token goes through): its gate, or None
    where the shared expert always counts in full."""
    gates: dict[int, torch.nn.Module | None] = {}
    layers = decoder_layers(model)
    for index in found:
        block = next((m for m in layers[index].modules() if any(hasattr(m, n) for n in SHARED_NAMES)), None)
        if block is not None:
            gates[index] = getattr(block, SHARED_GATE, None)
    return gates


@contextmanager
def recording(
    found: dict[int, torch.nn.Module], gates: dict[int, torch.nn.Module | None]
) -> Iterator[dict[int, tuple[torch.Tensor, ...]]]:
    """Inside, each MoE layer's (experts, weights, entropy, shared expert's weight) of the tokens it
    routed, by layer, on the device. The shared weight is NaN where the layer has no shared expert."""
    captured: dict[int, tuple[torch.Tensor, ...]] = {}
    shared: dict[int, torch.Tensor] = {}

    def hook_for(layer: int) -> Callable[..., Any]:
        def hook(module: Any, args: Any, output: Any) -> Any:
            if isinstance(output, tuple) and len(output) == 3:  # (logits, weights, experts): most families
                logits, weights, experts = output
            elif isinstance(output, tuple) and len(output) == 2:  # Llama 4: (scores of every expert, logits)
                scores, logits = output
                experts = torch.topk(logits, module.top_k, dim=-1).indices  # as the router picks them
                weights = scores.gather(-1, experts)
            else:
                return
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            entropy = -(logprobs.exp() * logprobs).sum(-1) / np.log(2)  # bits
            captured[layer] = (experts, weights.float(), entropy)

        return hook

    def gate_for(layer: int) -> Callable[..., Any]:
        def hook(module: Any, args: Any, output: Any) -> Any:
            shared[layer] = torch.sigmoid(output.float()).reshape(-1)

        return hook

    handles = [router.register_forward_hook(hook_for(layer)) for layer, router in found.items()]
    handles += [gate.register_forward_hook(gate_for(layer)) for layer, gate in gates.items() if gate is not None]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()
    for layer, (experts, weights, entropy) in list(captured.items()):
        always = 1.0 if layer in gates else float("nan")
        captured[layer] = (experts, weights, entropy, shared.get(layer, torch.full_like(entropy, always)))


def route_tensors(captured: dict[int, tuple[torch.Tensor, ...]]) -> dict[str, torch.Tensor]:
    """One pass's routing as tensors for the step's one transfer, layers in order: experts and weights
    (tokens, layers, k), entropy and the shared expert's weight (tokens, layers)."""
    layers = sorted(captured)
    return {
        "route_experts": torch.stack([captured[n][0] for n in layers], 1).to(torch.int32),
        "route_weights": torch.stack([captured[n][1] for n in layers], 1),
        "route_entropy": torch.stack([captured[n][2] for n in layers], 1),
        "route_shared": torch.stack([captured[n][3] for n in layers], 1),
    }
