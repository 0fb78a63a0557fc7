"""A Hugging Face model's own output: the final norm wherever it lives, an output projection, the
unembedding and its logit transforms (scales, soft-capping), parallel streams merged as the model merges
them; and the logit lens read through them, from residuals however they were had (hooks on a model run
here, a server's capture). Shared by every backend that reads a model's head."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Inspection, LensLayer
from tokenviz.tensors.vocabulary_rows import readings

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


def _through(
    lens: Callable[[torch.Tensor], torch.Tensor], residual: torch.Tensor, last: torch.Tensor | None
) -> list[torch.Tensor]:
    """`residual`'s rows through `lens`, the last row's logits `last` where given (not computed again):
    the logits in blocks of rows, in order."""
    if last is None:
        return [lens(residual)]
    return [lens(residual[:-1]), last] if residual.shape[0] > 1 else [last]


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
    rows: Sequence[int] | None = None,
    last_logits: torch.Tensor | None = None,
) -> list[Inspection]:
    """Each position's Inspection from the residual `stream` (one row per lens row: `rows`, or every
    layer + 1, positions, hidden) of `ids`, read through `lens` (the final norm and head); `engine` gives
    the pieces and the model's info. `last_logits` (len(positions), vocab): the model's own logits at
    each, the last layer's row as it is (where the lens's head is the model's own, bit for bit), not
    computed again."""
    out = []
    numbers = list(range(stream.shape[0]) if rows is None else rows)
    own = last_logits.float() if last_logits is not None and numbers[-1] == engine.info.layers else None
    for k, (position, chosen_id, row) in enumerate(zip(positions, chosen, embedding_rows)):
        residual = stream[:, position]  # (rows, H)
        blocks = _through(lens, residual, None if own is None else own[k : k + 1])
        read = readings(blocks, top, [chosen_id, *pinned])  # the last row's numbers are the step's own
        norms = residual.float().norm(dim=-1).tolist()
        lens_rows = tuple(
            LensLayer(
                layer=layer,
                top=tuple((i, engine.piece(i), p) for i, p in zip(reading.top_ids, reading.top_p)),
                chosen_rank=reading.followed_ranks[0],
                chosen_prob=reading.followed_p[0],
                residual_norm=float(norms[n]),
                pinned=tuple(zip(reading.followed_ranks[1:], reading.followed_p[1:])),
            )
            for n, (layer, reading) in enumerate(zip(numbers, read))
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
                lens=lens_rows,
                pinned=tuple((token, engine.piece(token)) for token in pinned),
            )
        )
    return out
