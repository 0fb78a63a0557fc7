"""Inside one position: the embedding, the residual stream layer by layer, and the logit lens.

Computed on demand with a forward pass over the sequence up to that position (no cache, so the
journey's cache is untouched), capturing each decoder layer's output with forward hooks. The lens
applies what the model itself applies after its last layer (its final norm wherever it lives, an
output projection, the unembedding and the model's own logit transforms) to every layer's residual
stream, so the last layer's lens is exactly the model's output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from tokenviz.backends.transformers.device_map import weights_at_hand
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.backends.transformers.parts import decoder_layers, last_logits
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Inspection, LensLayer

MERGE_EPSILON = 1e-5  # Gemma 3n's floor under a stream's magnitude
NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f", "layer_norm")


def _owners(model: Any) -> tuple[torch.nn.Module, ...]:
    """The base model and its direct children (OPT keeps its final norm at model.decoder)."""
    base = model.base_model
    return (base, *base.children())


def submodule(model: Any, names: tuple[str, ...]) -> torch.nn.Module | None:
    """The first of `names` on the base model, or on one of its direct children."""
    for owner in _owners(model):
        for name in names:
            module = getattr(owner, name, None)
            if isinstance(module, torch.nn.Module):
                return module
    return None


def final_norm(model: Any) -> torch.nn.Module:
    """The norm the model applies after its last layer: by its usual names, else the one norm the base
    model holds outside its layers, whatever it is called (LFM2's is `embedding_norm`). The lens
    checks its last layer against the model's output, so a wrong guess is said, never shown."""
    norm = submodule(model, NORM_NAMES)
    if norm is not None:
        return norm
    layers = set(map(id, decoder_layers(model)))
    norms = {
        id(module): module
        for owner in _owners(model)
        if id(owner) not in layers
        for module in owner.children()
        if id(module) not in layers and "norm" in type(module).__name__.lower()
    }
    if len(norms) != 1:
        raise TokenvizError(
            f"the logit lens cannot follow {type(model).__name__}: "
            f"{'it has no final norm' if not norms else 'which of its norms is the final one is not known'}"
        )
    return next(iter(norms.values()))


def softcap(model: Any, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-capping (Gemma 2), where it has one."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    return logits if cap is None else torch.tanh(logits / cap) * cap


def head_logits_before_cap(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The output projection where there is one, the unembedding and the model's logit scaling: an
    affine map of final hidden states (after the final norm)."""
    project_out = submodule(model, ("project_out",))  # OPT, when its embedding is narrower
    if project_out is not None:
        hidden = project_out(hidden)
    logits: torch.Tensor = model.get_output_embeddings()(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # a float64 model stays float64
    config = model.config
    if getattr(config, "logit_scale", None) is not None:  # Cohere
        logits = logits * config.logit_scale
    if getattr(config, "logits_scaling", None) is not None:  # Granite
        logits = logits / config.logits_scaling
    return logits


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's output logits for final hidden states (after its final norm): the output
    projection where there is one, the unembedding, then the model's own logit transforms."""
    return softcap(model, head_logits_before_cap(model, hidden))


def stream_merge(model: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """For a model whose layers carry parallel streams (Gemma 3n's AltUp: (streams, batch, positions,
    hidden)), what it does to them after its last layer: streams 1.. projected back, scaled to stream
    0's magnitude, and all averaged. The lens does the same after every layer, so its last layer is
    the model's output. None for a model with one stream."""
    unembed = getattr(model.base_model, "altup_unembed_projections", None)
    if unembed is None:
        return None

    def merge(streams: torch.Tensor) -> torch.Tensor:
        target = torch.mean(streams[0] ** 2, dim=-1, keepdim=True) ** 0.5
        parts = [streams[0]]
        for i, project in enumerate(unembed, start=1):
            part = project(streams[i]).to(dtype=streams[0].dtype)
            magnitude = torch.sqrt(torch.mean(part**2, dim=-1, keepdim=True).clamp(min=MERGE_EPSILON))
            parts.append(part * target / magnitude)
        return torch.stack(parts).mean(0)

    return merge


@torch.inference_mode()
def residual_stream(runner: ModelAccess, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(layers + 1, positions, hidden): the embeddings, then each decoder layer's output (streams
    merged as the model merges them); and the model's own logits after the last of `ids`."""
    model = runner.model
    layers = decoder_layers(model)
    merge = stream_merge(model)
    captured: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        captured.append(merge(hidden)[0] if merge else hidden[0])

    handles = [layer.register_forward_hook(hook) for layer in layers]
    if merge is not None:
        joined = merge

        def entering(
            module: torch.nn.Module, args: Any
        ) -> Any:  # the streams the first layer receives: the lens's layer 0
            captured.append(joined(args[0])[0])

        handles.append(layers[0].register_forward_pre_hook(entering))
    try:
        input_ids = torch.tensor([ids], device=runner.device)
        first = [] if merge else [model.get_input_embeddings()(input_ids)[0]]
        keep = last_logits(len(ids), runner.device)
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits[0, -1]
    finally:
        for handle in handles:
            handle.remove()
    try:
        return torch.stack([*first, *captured]), logits
    except RuntimeError as exc:  # a layer whose output is not one residual stream
        raise TokenvizError(f"the logit lens cannot follow {type(model).__name__}'s layers ({exc})") from None


@torch.inference_mode()
def lens_logits(runner: ModelAccess, residual: torch.Tensor) -> torch.Tensor:
    """The final norm and the model's head applied to each layer's residual: (layers + 1, ..., vocab)."""
    model = runner.model
    return head_logits(model, final_norm(model)(residual))


@torch.inference_mode()
def inspect_positions(
    runner: ModelAccess,
    ids: list[int],
    positions: list[int],
    chosen: list[int],
    top: int = 3,
    embedding_dims: int = 16,
    pinned: tuple[int, ...] = (),
) -> list[Inspection]:
    """Inspect several positions of `ids` with one forward pass. `chosen[i]` is the token that
    followed positions[i]; it and the `pinned` tokens are followed through the layers."""
    stream, own = residual_stream(runner, ids)  # (L+1, T, H)
    last = lens_logits(runner, stream[-1, -1:])[0]
    if not torch.allclose(last.float(), own.float(), rtol=1e-3, atol=1e-3 * float(own.abs().max())):
        raise TokenvizError(
            f"the logit lens of {type(runner.model).__name__} is not exact: its last layer differs from the "
            f"model's output by {float((last.float() - own.float()).abs().max()):.3g}"
        )
    embeddings = runner.model.get_input_embeddings()
    with weights_at_hand(embeddings):  # (it may live on the disk: fetched once for every position)
        rows_of = cast(torch.Tensor, embeddings.weight)[[ids[p] for p in positions]].float()
    return inspections(
        stream, ids, positions, chosen, pinned, lambda r: lens_logits(runner, r), rows_of, runner, top, embedding_dims
    )


@torch.inference_mode()
def inspections(
    stream: torch.Tensor,
    ids: list[int],
    positions: list[int],
    chosen: list[int],
    pinned: tuple[int, ...],
    lens: Callable[[torch.Tensor], torch.Tensor],
    embedding_rows: torch.Tensor,
    engine: Any,
    top: int = 3,
    embedding_dims: int = 16,
) -> list[Inspection]:
    """Each position's Inspection from the residual `stream` (layers + 1, positions, hidden) of `ids`,
    read through `lens` (the final norm and head); `engine` gives the pieces and the model's info."""
    out = []
    for position, chosen_id, row in zip(positions, chosen, embedding_rows):
        residual = stream[:, position]  # (L+1, H)
        probs = torch.softmax(lens(residual), -1)  # (L+1, V)
        norms = residual.float().norm(dim=-1).tolist()
        top_p, top_i = torch.topk(probs, top, dim=-1)
        followed = probs[:, [chosen_id, *pinned]]  # (L+1, 1 + pinned)
        ranks_all = ((probs[:, None, :] > followed[:, :, None]).sum(-1) + 1).tolist()
        followed_p = followed.tolist()
        rows = tuple(
            LensLayer(
                layer=layer,
                top=tuple(
                    (int(i), engine.piece(int(i)), float(p))
                    for i, p in zip(top_i[layer].tolist(), top_p[layer].tolist())
                ),
                chosen_rank=int(ranks_all[layer][0]),
                chosen_prob=float(followed_p[layer][0]),
                residual_norm=float(norms[layer]),
                pinned=tuple(zip(ranks_all[layer][1:], followed_p[layer][1:])),
            )
            for layer in range(probs.shape[0])
        )
        token_id = ids[position]
        out.append(
            Inspection(
                position=position,
                token_id=token_id,
                token_text=engine.piece(token_id),
                chosen_id=chosen_id,
                embedding_head=tuple(row[:embedding_dims].tolist()),
                embedding_norm=float(row.norm()),
                tied_embeddings=engine.info.tied_embeddings,
                positions=engine.info.positions,
                lens=rows,
                pinned=tuple((token, engine.piece(token)) for token in pinned),
            )
        )
    return out
