"""Inside one position: the embedding, the residual stream layer by layer, and the logit lens.

Computed on demand with a forward pass over the sequence up to that position (no cache, so the
journey's cache is untouched), capturing each decoder layer's output with forward hooks. The lens
applies what the model itself applies after its last layer (its final norm wherever it lives, an
output projection, the unembedding and the model's own logit transforms) to every layer's residual
stream, so the last layer's lens is exactly the model's output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch

from tokenviz.backends.shared.output_head import final_norm, head_logits, inspections, stream_merge
from tokenviz.backends.shared.parts import decoder_layers, last_logits
from tokenviz.backends.transformers.device_map import weights_at_hand
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Inspection


@contextmanager
def layer_streams(model: Any) -> Iterator[list[torch.Tensor]]:
    """While inside, each decoder layer's output (streams merged as the model merges them), batch row 0,
    appended to the list yielded as a pass computes it; with merged streams, what the first layer receives
    first (the lens's layer 0: without, that row is the embeddings, see embedded)."""
    layers = decoder_layers(model)
    merge = stream_merge(model)
    captured: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        captured.append(merge(hidden)[0] if merge else hidden[0])

    handles = [layer.register_forward_hook(hook) for layer in layers]
    if merge is not None:
        joined = merge

        def entering(module: torch.nn.Module, args: Any) -> Any:
            captured.append(joined(args[0])[0])

        handles.append(layers[0].register_forward_pre_hook(entering))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def stacked(model: Any, input_ids: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
    """(layers + 1, positions, hidden): the lens's rows of a pass over `input_ids` (1, positions) whose
    layers layer_streams captured: the embeddings first where the streams are not merged."""
    first = [] if stream_merge(model) else [model.get_input_embeddings()(input_ids)[0]]
    try:
        return torch.stack([*first, *captured])
    except RuntimeError as exc:  # a layer whose output is not one residual stream
        raise TokenvizError(f"the logit lens cannot follow {type(model).__name__}'s layers ({exc})") from None


@torch.inference_mode()
def residual_stream(runner: ModelAccess, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(layers + 1, positions, hidden): the embeddings, then each decoder layer's output (streams
    merged as the model merges them); and the model's own logits after the last of `ids`."""
    model = runner.model
    input_ids = torch.tensor([ids], device=runner.device)
    with layer_streams(model) as captured:
        keep = last_logits(len(ids), runner.device)
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=keep).logits[0, -1]
    return stacked(model, input_ids, captured), logits


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
    rows: tuple[int, ...] | None = None,
) -> list[Inspection]:
    """Inspect several positions of `ids` with one forward pass. `chosen[i]` is the token that
    followed positions[i]; it and the `pinned` tokens are followed through the layers (the lens rows
    `rows`, or every one). The lens at the step just taken is read from that step's own pass where it
    kept it (step_lens), else from a pass over `ids` of its own."""
    runner.step_lens.asked()
    kept = runner.step_lens.at(ids, positions)
    if kept is not None:  # the stream of the last position alone: inspected as the only one
        stream, own = kept
        found = inspect_positions_of(runner, stream, own, [ids[-1]], [0], chosen, top, embedding_dims, pinned, rows)
        return [dataclasses.replace(found[0], position=positions[0])]
    stream, own = residual_stream(runner, ids)  # (L+1, T, H)
    return inspect_positions_of(runner, stream, own, ids, positions, chosen, top, embedding_dims, pinned, rows)


def inspect_positions_of(
    runner: ModelAccess,
    stream: torch.Tensor,
    own: torch.Tensor,
    ids: list[int],
    positions: list[int],
    chosen: list[int],
    top: int,
    embedding_dims: int,
    pinned: tuple[int, ...],
    rows: tuple[int, ...] | None,
) -> list[Inspection]:
    """inspect_positions from the residual `stream` of `ids` (layers + 1, len(ids), hidden) and the model's
    own logits after the last of them."""
    last = lens_logits(runner, stream[-1, -1:])[0]
    if not torch.allclose(last.float(), own.float(), rtol=1e-3, atol=1e-3 * float(own.abs().max())):
        raise TokenvizError(
            f"the logit lens of {type(runner.model).__name__} is not exact: its last layer differs from the "
            f"model's output by {float((last.float() - own.float()).abs().max()):.3g}"
        )
    embeddings = runner.model.get_input_embeddings()
    with weights_at_hand(embeddings):  # it may live on the disk: fetched once for every position
        rows_of = cast(torch.Tensor, embeddings.weight)[[ids[p] for p in positions]].float()
    shown = stream if rows is None else stream[list(rows)]
    return inspections(
        shown,
        ids,
        positions,
        chosen,
        pinned,
        lambda r: lens_logits(runner, r),
        rows_of,
        runner,
        top,
        embedding_dims,
        rows,
    )
