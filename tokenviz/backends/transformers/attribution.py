"""Which earlier tokens led to a token: leave-one-out and gradient × input.

Both explain the log-probability of one token (`target`) after the last of `ids`, in the model's
raw distribution (its own logits, before any sampling setting), and give one score per position of
`ids`; positive means the token there raised the target's log-probability.

- Leave-one-out is exact by construction: the full log-probability minus the log-probability with
  that one token taken out of the sequence (the tokens after it move up a position). It costs one
  forward pass over the context per position, batched.
- Gradient × input is the first-order estimate of the same question from one forward and one
  backward pass: the gradient of the log-probability with respect to each input embedding, dotted
  with that embedding (what scaling the embedding towards zero would change, to first order).

Neither touches the journey's cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tokenviz.backends.transformers.interrupt import layer_by_layer
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.contract.results import ATTRIBUTION_METHODS

BATCH_TOKENS = 4096  # leave-one-out feeds at most this many tokens in one forward pass


def _wide(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (half-precision logits are widened; a float64 model stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _logprobs(runner: ModelAccess, batch: torch.Tensor, target: int) -> torch.Tensor:
    logits = runner.model(input_ids=batch, use_cache=False, logits_to_keep=1).logits[:, -1]
    return torch.log_softmax(_wide(logits), dim=-1)[:, target]


@torch.inference_mode()
def leave_one_out(
    runner: ModelAccess,
    ids: list[int],
    target: int,
    progress: Callable[[int, int], None] = lambda done, total: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[float, list[float]]:
    """(log p(target | ids), one score per position: that minus log p(target | ids without it))."""
    if len(ids) < 2:
        raise TokenvizError("leave-one-out needs at least two tokens of context")
    sequence = torch.tensor(ids, device=runner.device)
    full = float(_logprobs(runner, sequence[None], target)[0])
    n, per_batch = len(ids), max(1, BATCH_TOKENS // len(ids))
    keep = ~torch.eye(n, dtype=torch.bool, device=runner.device)  # row j: every position but j
    scores: list[float] = []
    for start in range(0, n, per_batch):
        if cancelled():
            raise Cancelled("attribution cancelled")
        rows = range(start, min(start + per_batch, n))
        batch = sequence.expand(len(rows), n)[keep[rows.start : rows.stop]].view(len(rows), n - 1)
        with layer_by_layer(runner.model, cancelled, what="attribution"):  # Escape within a long batch too
            scores += (full - _logprobs(runner, batch, target)).tolist()
        progress(rows.stop, n)
    return full, scores


def grad_times_input(
    runner: ModelAccess,
    ids: list[int],
    target: int,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[float, list[float]]:
    """(log p(target | ids), one score per position: ∂ log p / ∂ embedding · embedding). The forward
    pass reports its layers to `progress` and ends at the next one when `cancelled()`."""
    model = runner.model
    with torch.inference_mode(False), torch.enable_grad():
        input_ids = torch.tensor([ids], device=runner.device)
        embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        with layer_by_layer(model, cancelled, progress, what="attribution"):
            logits = model(inputs_embeds=embeds, use_cache=False, logits_to_keep=1).logits[0, -1]
        logprob = torch.log_softmax(_wide(logits), dim=-1)[target]
        (grad,) = torch.autograd.grad(logprob, embeds)
        scores = (_wide(grad) * _wide(embeds.detach())).sum(-1)[0]
    return float(logprob.detach()), scores.tolist()


def attribute(
    runner: ModelAccess,
    ids: list[int],
    target: int,
    method: str,
    progress: Callable[[int, int], None] = lambda done, total: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[float, list[float]]:
    if method == "loo":
        return leave_one_out(runner, ids, target, progress, cancelled)
    if method == "grad":
        return grad_times_input(runner, ids, target, progress, cancelled)
    raise TokenvizError(f"unknown attribution method {method!r}: choose {' or '.join(ATTRIBUTION_METHODS)}")
