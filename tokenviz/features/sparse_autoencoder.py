"""A sparse autoencoder on the residual stream after one decoder layer: its encode, as the library that made
it computes it (SAELens' standard, JumpReLU, TopK and gated; Gemma Scope's JumpReLU; sparsify's TopK), its
decode, and its reading of one residual (contract.features).

Every architecture computes a pre-activation `(x - b_dec·[apply_b_dec]) @ W_enc + b_enc`, then:
standard ReLU; JumpReLU ReLU where the pre-activation is above the feature's threshold; TopK the k largest
after ReLU (SAELens may scale the pre-activation by each decoder row's norm first); gated a gate (its own
bias, the same W_enc) times a magnitude (W_enc scaled by exp(r_mag), its own bias) through ReLU. The decode
is `acts @ W_dec + b_dec` (TopK with rescaling: each activation times its row's norm, on the unit rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.features import FeatureActivation, FeatureReading
from tokenviz.contract.text import safe_text

Architecture = Literal["standard", "jumprelu", "topk", "gated"]
ARCHITECTURES: tuple[Architecture, ...] = ("standard", "jumprelu", "topk", "gated")
SHOWN = 64  # a reading's features kept, strongest first (its L0 counts them all)


@dataclass(frozen=True)
class SparseAutoencoder:
    name: str  # its folder's name: how the views and the document name it
    layout: str  # "SAELens", "Gemma Scope 2" or "sparsify": how its folder holds it
    architecture: Architecture
    layer: int  # it reads the residual after this decoder layer
    W_enc: torch.Tensor  # (d_in, d_sae)
    b_enc: torch.Tensor  # (d_sae,) (gated: b_mag's place is its own; b_enc is b_gate's)
    W_dec: torch.Tensor  # (d_sae, d_in)
    b_dec: torch.Tensor  # (d_in,)
    apply_b_dec_to_input: bool = True
    threshold: torch.Tensor | None = None  # jumprelu
    k: int = 0  # topk
    rescale_by_decoder_norm: bool = False  # topk (SAELens' rescale_acts_by_decoder_norm)
    r_mag: torch.Tensor | None = None  # gated
    b_mag: torch.Tensor | None = None  # gated
    folder: str = ""  # the folder it was read from, resolved (an intervention by one of its features names it)

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    def to(self, device: torch.device) -> SparseAutoencoder:
        """The same SAE, its tensors on `device`."""
        moved: dict[str, Any] = {
            field.name: value.to(device)
            for field in dataclasses.fields(self)
            if isinstance(value := getattr(self, field.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The feature activations of residuals `x` (n, d_in): (n, d_sae), float32."""
        x = x.to(torch.float32)
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        if self.architecture == "jumprelu":
            assert self.threshold is not None
            return torch.relu(pre) * (pre > self.threshold).to(pre.dtype)
        if self.architecture == "topk":
            if self.rescale_by_decoder_norm:
                pre = pre * self.W_dec.norm(dim=-1)
            top = torch.topk(pre, self.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
        if self.architecture == "gated":
            assert self.r_mag is not None and self.b_mag is not None
            gate = (pre > 0).to(pre.dtype)
            return gate * torch.relu(x @ (self.W_enc * self.r_mag.exp()) + self.b_mag)
        return torch.relu(pre)

    def decode(self, acts: torch.Tensor) -> torch.Tensor:
        """What `acts` (n, d_sae) write back to the residual: (n, d_in)."""
        return acts @ self.decoder_rows() + self.b_dec

    def decoder_rows(self, features: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """The rows the decode multiplies activations by (each of `features`, or all): W_dec's, unit rows
        where it rescales TopK activations by their norms."""
        rows = self.W_dec if features is None else self.W_dec[features]
        if self.rescale_by_decoder_norm:
            rows = rows / rows.norm(dim=-1, keepdim=True)
        return rows

    def read(self, x: torch.Tensor, position: int) -> FeatureReading:
        """Its reading of one residual `x` (d_in,) at `position`: the active features, each's share of
        |x|² (its decoded row · x), the L0 and the relative error of the reconstruction."""
        x = x.to(torch.float32).reshape(1, -1)
        acts = self.encode(x)[0]
        active = torch.nonzero(acts > 0).flatten()
        order = active[torch.argsort(acts[active], descending=True)][:SHOWN]
        rows = self.decoder_rows(order)
        squared = float((x * x).sum()) or 1.0
        shares = (acts[order] * (rows @ x[0])) / squared
        error = float((x[0] - self.decode(acts[None])[0]).norm()) / (squared**0.5)
        features = tuple(
            FeatureActivation(int(i), float(a), float(s))
            for i, a, s in zip(order.tolist(), acts[order].tolist(), shares.tolist())
        )
        return FeatureReading(self.name, self.layer, position, features, int(active.numel()), error)


def sae_named(saes: Sequence[SparseAutoencoder], name: str, feature: int) -> SparseAutoencoder:
    """The first of `saes` of this name, which has `feature`: else one line."""
    sae = next((s for s in saes if s.name == name), None)
    if sae is None:
        loaded = ", ".join(s.name for s in saes) or "none: load one with --sae DIR"
        raise SettingsError(f"no SAE named {safe_text(name)!r} is loaded ({loaded})")
    if not 0 <= feature < sae.d_sae:
        raise SettingsError(f"{sae.name} has features 0-{sae.d_sae - 1:,}: no feature {feature:,}")
    return sae
