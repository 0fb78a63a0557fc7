"""An MoE model's routing as a step's transfer carries it, whichever runtime read it: per position fed,
each MoE layer's chosen experts and weights (`route_experts`, `route_weights`: tokens, layers, k), the
router's entropy in bits and the shared expert's weight (`route_entropy`, `route_shared`: tokens, layers;
NaN where a layer has no shared expert)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tokenviz.contract.records import Routing


def join_routes(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Several passes' routing (a prompt fed in chunks) as one, in order of position."""
    if len(parts) == 1:
        return parts[0]
    return {name: torch.cat([p[name] for p in parts]) for name in parts[0]}


def read_routing(host: dict[str, np.ndarray], layers: Sequence[int]) -> Routing | None:
    """The routing in a step's transfer; `layers` are the model's MoE layers, in order."""
    if "route_experts" not in host:
        return None
    experts = host["route_experts"]
    return Routing(
        layers=tuple(layers),
        k=int(experts.shape[-1]),
        positions=int(experts.shape[0]),
        experts=experts.astype(np.uint16).tobytes(),
        weights=host["route_weights"].astype(np.float32).tobytes(),
        entropy=host["route_entropy"].astype(np.float32).tobytes(),
        shared=host["route_shared"].astype(np.float32).tobytes(),
    )
