"""An MoE GGUF's routing as llama.cpp computes it: in each MoE layer, the experts its router chose for each
token, the weights their outputs were scaled by, the router's entropy and a shared expert's gate, read
through the evaluation callback (capture.py) in the passes the journey runs anyway: no pass of its own.
The layers are those whose tensors include a router (blk.L.ffn_gate_inp), as the file holds them."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from tokenviz.backends.llamacpp.pinned import (
    CHOSEN_EXPERTS,
    EXPERT_WEIGHTS,
    RANKED_EXPERTS,
    ROUTER_LOGITS,
    SHARED_GATE,
    of_layer,
)
from tokenviz.files.gguf_header import GgufHeader

ROUTER = "blk.{}.ffn_gate_inp.weight"
GATED_SHARED_EXPERT = "blk.{}.ffn_gate_inp_shexp.weight"  # its weight a token is the gate's sigmoid
SHARED_EXPERT = "blk.{}.ffn_up_shexp.weight"  # one every token goes through (in full where ungated)


@dataclass(frozen=True)
class Routers:
    """The MoE layers of a GGUF and how many experts each chooses a token."""

    layers: tuple[int, ...]
    experts: int  # routed experts a layer
    k: int  # chosen a token
    gated: frozenset[int]  # layers whose shared expert's weight a token is its gate's
    ungated: frozenset[int]  # layers whose shared expert every token goes through in full

    @cached_property
    def names(self) -> frozenset[str]:
        """What a pass captures to give its routing (asked every step: made once)."""
        kinds = (ROUTER_LOGITS, RANKED_EXPERTS, CHOSEN_EXPERTS, *EXPERT_WEIGHTS)
        return frozenset({of_layer(kind, n) for n in self.layers for kind in kinds}) | {
            of_layer(SHARED_GATE, n) for n in self.gated
        }

    def routes(self, found: dict[str, list[np.ndarray]], tokens: int) -> dict[str, torch.Tensor] | None:
        """A pass's routing of its `tokens` tokens as a step's transfer carries it (shared.routes); None
        where a layer kept fewer rows than tokens (llama.cpp prunes the last layer to the positions whose
        logits a pass asks for)."""
        experts, weights, entropy, shared = [], [], [], []
        for n in self.layers:
            chosen = self._chosen(found, n, tokens)
            scaled = next(
                (_joined(found, of_layer(w, n)) for w in reversed(EXPERT_WEIGHTS) if of_layer(w, n) in found), None
            )
            if chosen is None or scaled is None or scaled.size != tokens * self.k:
                return None
            experts.append(chosen)
            weights.append(scaled.reshape(tokens, self.k))
            logits = _joined(found, of_layer(ROUTER_LOGITS, n))
            if logits is not None and logits.size == tokens * self.experts:
                entropy.append(_entropy_bits(logits.reshape(tokens, self.experts)))
            else:
                entropy.append(np.full(tokens, np.nan))
            gate = _joined(found, of_layer(SHARED_GATE, n)) if n in self.gated else None
            if gate is None or gate.size != tokens:
                gate = np.full(tokens, 1.0 if n in self.ungated else np.nan)
            shared.append(gate)
        return {
            "route_experts": torch.from_numpy(np.stack(experts, 1)),
            "route_weights": torch.from_numpy(np.stack(weights, 1).astype(np.float32)),
            "route_entropy": torch.from_numpy(np.stack(entropy, 1).astype(np.float32)),
            "route_shared": torch.from_numpy(np.stack(shared, 1).astype(np.float32)),
        }

    def _chosen(self, found: dict[str, list[np.ndarray]], layer: int, tokens: int) -> np.ndarray | None:
        """The experts layer `layer` chose for each of `tokens` tokens: (tokens, k) int32."""
        ranked = _joined(found, of_layer(RANKED_EXPERTS, layer))
        if ranked is not None and ranked.size == tokens * self.experts:
            return ranked.view(np.int32).reshape(tokens, self.experts)[:, : self.k].copy()
        chosen = _joined(found, of_layer(CHOSEN_EXPERTS, layer))  # (contiguous where a family chose them)
        return (
            chosen.view(np.int32).reshape(tokens, self.k)
            if chosen is not None and chosen.size == tokens * self.k
            else None
        )


def moe_routers(header: GgufHeader | None, architecture: str) -> Routers | None:
    """The GGUF's routers, or None for a dense model."""
    if header is None:
        return None
    experts = header.number(f"{architecture}.expert_count") or 0
    k = header.number(f"{architecture}.expert_used_count") or 0
    layers = header.number(f"{architecture}.block_count") or 0
    moe = tuple(n for n in range(layers) if ROUTER.format(n) in header.tensor_names)
    if not moe or not 1 <= k <= experts:
        return None
    names = header.tensor_names
    gated = frozenset(n for n in moe if GATED_SHARED_EXPERT.format(n) in names)
    return Routers(moe, experts, k, gated, frozenset(n for n in moe if SHARED_EXPERT.format(n) in names) - gated)


def _joined(found: dict[str, list[np.ndarray]], name: str) -> np.ndarray | None:
    """A captured tensor's parts (one a micro-batch) as one, in order of position."""
    parts = found.get(name)
    return np.concatenate(parts) if parts else None


def _entropy_bits(logits: np.ndarray) -> np.ndarray:
    """The router's entropy over every expert, in bits (of the softmax of its logits, as transformers' is
    read: routing.py there)."""
    logprobs = torch.log_softmax(torch.from_numpy(logits).double(), dim=-1)
    bits: np.ndarray = (-(logprobs.exp() * logprobs).sum(-1) / np.log(2)).numpy()
    return bits
