"""Sparse autoencoders made in the tests, in each layout their libraries write (tokenviz.features.sae_folder),
their weights random but leaving some features on and some off at a residual of the model's size."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

FEATURES, K = 64, 8


def weights(hidden: int, seed: int) -> dict[str, torch.Tensor]:
    """An SAE's weights that leave some features on and some off at a residual of the tiny model's size."""
    g = torch.Generator().manual_seed(seed)
    w_enc = torch.randn(hidden, FEATURES, generator=g) / hidden**0.5
    return {
        "W_enc": w_enc,
        "b_enc": -0.05 * torch.rand(FEATURES, generator=g),
        "W_dec": torch.randn(FEATURES, hidden, generator=g) / hidden**0.5,
        "b_dec": 0.1 * torch.randn(hidden, generator=g),
        "threshold": 0.1 * torch.rand(FEATURES, generator=g),
        "b_mag": 0.05 * torch.randn(FEATURES, generator=g),
        "r_mag": 0.1 * torch.randn(FEATURES, generator=g),
    }


def saelens_sae(folder: Path, architecture: str, hidden: int, seed: int, layer: int = 1) -> Path:
    """An SAE in SAELens's layout (cfg.json as its save_model writes it, the hook in its metadata)."""
    folder.mkdir(parents=True)
    w = weights(hidden, seed)
    names = {"standard": ["W_enc", "b_enc"], "jumprelu": ["W_enc", "b_enc", "threshold"], "topk": ["W_enc", "b_enc"],
             "gated": ["W_enc", "b_mag", "r_mag"]}[architecture]  # fmt: skip
    tensors = {name: w[name] for name in [*names, "W_dec", "b_dec"]}
    if architecture == "gated":
        tensors["b_gate"] = w["b_enc"]
    save_file(tensors, str(folder / "sae_weights.safetensors"))
    config = {"d_in": hidden, "d_sae": FEATURES, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
              "normalize_activations": "none", "reshape_activations": "none", "architecture": architecture,
              "metadata": {"hook_name": f"blocks.{layer}.hook_resid_post"}}  # fmt: skip
    if architecture == "topk":
        config |= {"k": K, "rescale_acts_by_decoder_norm": False}
    (folder / "cfg.json").write_text(json.dumps(config))
    return folder


def gemma_scope_sae(folder: Path, hidden: int, seed: int, layer: int = 1) -> Path:
    """An SAE in Gemma Scope 2's layout: config.json naming its hook point, params.safetensors in its names."""
    folder.mkdir(parents=True)
    w = weights(hidden, seed)
    names = {"w_enc": "W_enc", "b_enc": "b_enc", "w_dec": "W_dec", "b_dec": "b_dec", "threshold": "threshold"}
    save_file({theirs: w[ours] for theirs, ours in names.items()}, str(folder / "params.safetensors"))
    config = {"architecture": "jump_relu", "hf_hook_point_in": f"model.layers.{layer}.output", "model_name": "tiny"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def sparsify_sae(checkpoint: Path, hidden: int, seed: int, layer: int = 1) -> Path:
    """A sparsify checkpoint with one hook point, layers.`layer`: cfg.json and sae.safetensors as it saves them."""
    folder = checkpoint / f"layers.{layer}"
    folder.mkdir(parents=True)
    w = weights(hidden, seed)
    tensors = {"encoder.weight": w["W_enc"].T.contiguous(), "encoder.bias": w["b_enc"], "W_dec": w["W_dec"],
               "b_dec": w["b_dec"]}  # fmt: skip
    save_file(tensors, str(folder / "sae.safetensors"))
    config = {"activation": "topk", "expansion_factor": 2, "normalize_decoder": True, "num_latents": FEATURES, "k": K,
              "multi_topk": False, "skip_connection": False, "transcode": False, "d_in": hidden}  # fmt: skip
    (folder / "cfg.json").write_text(json.dumps(config))
    return checkpoint
