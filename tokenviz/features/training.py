"""A small TopK sparse autoencoder trained here on a model's residual after one layer, written in SAELens'
layout (cfg.json and sae_weights.safetensors) for `--sae`, SAELens and anyone else to read: an SAE to try
the features on where none is published (the bundled model has none).

The recipe is the TopK SAE's (Gao et al., as sparsify trains it): the decoder's rows of unit norm, the
encoder its transpose at the start, b_dec the residuals' mean, Adam on the reconstruction's squared error;
the k largest ReLU'd pre-activations kept. Its figure is the fraction of the residuals' variance it leaves
unexplained (FVU), before and after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from tokenviz.contract.engine import Capability, Engine, require
from tokenviz.contract.errors import TokenvizError
from tokenviz.features.sparse_autoencoder import SparseAutoencoder

BATCH = 256
LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class Trained:
    sae: SparseAutoencoder
    fvu_before: float
    fvu_after: float
    residuals: int


def fvu(sae: SparseAutoencoder, x: torch.Tensor) -> float:
    """The fraction of `x`'s variance (around its mean) the SAE's reconstruction leaves unexplained."""
    with torch.no_grad():
        error = (x - sae.decode(sae.encode(x))).pow(2).sum()
        return float(error / (x - x.mean(0)).pow(2).sum().clamp_min(1e-12))


def train(
    residuals: torch.Tensor,
    layer: int,
    features: int,
    k: int,
    steps: int,
    seed: int = 0,
    progress: Callable[[int, int], None] = lambda done, total: None,
    name: str = "sae",
) -> Trained:
    """A TopK SAE of `features` (k active) on `residuals` (n, d_in), `steps` batches of BATCH."""
    x = residuals.to(torch.float32)
    generator = torch.Generator().manual_seed(seed)
    d_in = x.shape[1]
    w_dec = torch.randn(features, d_in, generator=generator)
    w_dec /= w_dec.norm(dim=-1, keepdim=True)
    params = {
        "W_enc": w_dec.T.clone().requires_grad_(),
        "b_enc": torch.zeros(features, requires_grad=True),
        "W_dec": w_dec.clone().requires_grad_(),
        "b_dec": x.mean(0).clone().requires_grad_(),
    }

    def made() -> SparseAutoencoder:
        t = {key: value.detach().clone() for key, value in params.items()}
        return SparseAutoencoder(name, "SAELens", "topk", layer, t["W_enc"], t["b_enc"], t["W_dec"], t["b_dec"], k=k)

    before = fvu(made(), x)
    optimizer = torch.optim.Adam(params.values(), lr=LEARNING_RATE)
    for step in range(steps):
        batch = x[torch.randint(0, x.shape[0], (min(BATCH, x.shape[0]),), generator=generator)]
        pre = (batch - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
        top = torch.topk(pre, k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        loss = (acts @ params["W_dec"] + params["b_dec"] - batch).pow(2).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():  # the decoder's rows kept of unit norm: an activation is its feature's size
            params["W_dec"] /= params["W_dec"].norm(dim=-1, keepdim=True).clamp_min(1e-12)
        progress(step + 1, steps)
    sae = made()
    return Trained(sae, before, fvu(sae, x), int(x.shape[0]))


def write_saelens(sae: SparseAutoencoder, folder: Path, model: str, extra: dict[str, object]) -> Path:
    """`sae` in SAELens' layout in `folder` (made): its config, hook and weights as SAELens saves them."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_dec": sae.b_dec}
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "sae_weights.safetensors"))
    config = {
        "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
        "normalize_activations": "none", "reshape_activations": "none", "architecture": "topk", "k": sae.k,
        "rescale_acts_by_decoder_norm": False,
        "metadata": {"hook_name": f"blocks.{sae.layer}.hook_resid_post", "model_name": model, **extra},
    }  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(config, indent=2, allow_nan=False) + "\n")
    return folder


def windows(ids: list[int], size: int) -> list[list[int]]:
    """`ids` cut into windows of at most `size` tokens (the model's context, or less)."""
    return [ids[i : i + size] for i in range(0, len(ids), size)] if ids else []


def steps_for(residuals: int, epochs: float = 4.0) -> int:
    """A default number of batches: a few passes over the residuals."""
    return max(1, math.ceil(epochs * residuals / BATCH))


def window_residuals(
    engine: Engine, parts: Sequence[Sequence[int]], layer: int, progress: Callable[[int, int], None]
) -> list[torch.Tensor]:
    """The residual after `layer` at every position of each window in `parts` but its first (a window's
    first token draws an outsized residual: the attention sink), a window read at a time (float32, on the
    CPU; a window of one token gives none)."""
    stream = require(engine, Capability.RESIDUAL, "an SAE's features")
    rows = []
    for done, part in enumerate(parts, 1):
        if len(part) > 1:
            rows.append(stream.residual(part, range(1, len(part)), layer).detach().to("cpu", torch.float32))
        else:
            rows.append(torch.zeros(0, engine.info.hidden))
        progress(done, len(parts))
    return rows


def collect_residuals(
    engine: Engine, ids: list[int], layer: int, window: int, progress: Callable[[int, int], None]
) -> torch.Tensor:
    """The residual after `layer` at every position of `ids` fed in windows of `window` tokens, each window's
    first position left out (window_residuals)."""
    rows = torch.cat(window_residuals(engine, windows(ids, window), layer, progress))
    if not len(rows):
        raise TokenvizError("the text is too short to train on: it needs two tokens or more")
    return rows
