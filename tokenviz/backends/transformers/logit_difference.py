"""Why token a and not token b: their logit difference split by what each layer wrote.

The residual stream before the final norm is a sum: the embeddings (with position embeddings and
any scale the model applies), then what each layer's attention and MLP added. With the final norm's
scale frozen at the value the forward pass computed, the norm is affine, and so is everything after
it up to the soft-capping (the output projection, the unembedding, the logit scaling). So the logit
difference splits exactly into one share per part of the sum (direct logit attribution), plus the
share of the norm's and the output layer's biases, plus what the soft-capping changed; the shares
add up to the model's own logit difference.

Each layer's share is what went into the residual stream between its input and the next layer's
(so nothing is missed); its MLP's share is what its MLP branch added (after a post-norm, where the
family has one), and the attention's share is the rest.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from tokenviz.backends.shared.output_head import final_norm, head_logits_before_cap, softcap
from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.interrupt import layer_by_layer
from tokenviz.backends.transformers.loaded_model_access import ModelAccess
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import LogitDifference

# Where a decoder layer's MLP branch ends, in the order to look: a post-norm on the MLP's output
# (Gemma 2 and 3, OLMo 2) before the MLP itself; OPT has no MLP module, only its last projection.
MLP_BRANCH_ENDS = ("post_feedforward_layernorm", "mlp", "ffn", "feed_forward", "block_sparse_moe", "fc2")
PROBE = 256.0  # the norm probe's size: large enough that the norm's epsilon does not matter


def _mlp_branch_end(layer: torch.nn.Module) -> torch.nn.Module:
    for name in MLP_BRANCH_ENDS:
        module = getattr(layer, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise TokenvizError(f"cannot find the MLP of {type(layer).__name__}: its logit difference cannot be split")


def _last(output: Any) -> torch.Tensor:
    """The last position's vector of a module's output (OPT's MLP works on (positions, hidden))."""
    tensor = output[0] if isinstance(output, tuple) else output
    last: torch.Tensor = tensor.reshape(-1, tensor.shape[-1])[-1]
    return last


class FrozenNorm:
    """The final norm as the affine map it is once its scale is fixed: x ↦ gain ⊙ centre(x) / scale + bias.

    Read from the module itself, whatever its kind: the bias is its output for zero; whether it
    centres (LayerNorm) or not (RMSNorm) shows when a constant is added; its gain from a large probe
    of alternating signs; the scale from the forward pass's own input and output.
    """

    def __init__(self, norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor):
        wide = torch.float64
        hidden = x.shape[-1]
        probe = PROBE * (1 - 2 * (torch.arange(hidden, device=x.device) % 2)).to(x.dtype)
        self.bias = norm(torch.zeros_like(x)).to(wide)
        probed = norm(probe).to(wide) - self.bias
        shifted = norm(probe + PROBE).to(wide) - self.bias
        self.centres = bool(torch.allclose(shifted, probed, rtol=1e-3, atol=1e-3 * float(probed.abs().max())))
        centred_probe = self._centre(probe.to(wide))
        probe_scale = centred_probe.pow(2).mean().sqrt()
        self.gain = probed * probe_scale / centred_probe
        # out - bias = gain ⊙ centre(x) / scale: the scale that fits best, in one line of least squares.
        direction = self.gain * self._centre(x.to(wide))
        self.scale = direction.pow(2).sum() / (direction * (out.to(wide) - self.bias)).sum()
        if not torch.allclose(self(x), out.to(wide), rtol=1e-3, atol=1e-3 * float(out.abs().max())):
            raise TokenvizError(f"the final norm ({type(norm).__name__}) is not a LayerNorm or RMSNorm: cannot split")

    def _centre(self, v: torch.Tensor) -> torch.Tensor:
        return v - v.mean(-1, keepdim=True) if self.centres else v

    def linear(self, v: torch.Tensor) -> torch.Tensor:
        """The norm's linear part with the frozen scale (no bias)."""
        normed: torch.Tensor = self.gain * self._centre(v.to(torch.float64)) / self.scale
        return normed

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        mapped: torch.Tensor = self.linear(v) + self.bias
        return mapped


@torch.inference_mode()
def residual_parts(
    runner: ModelAccess,
    ids: list[int],
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> tuple[torch.Tensor, ...]:
    """At the last of `ids`: (each layer's input and the final norm's input: (layers + 1, hidden);
    what each MLP branch added: (layers, hidden); the final norm's output; the model's logits).
    The pass reports its layers to `progress` and ends at the next one when `cancelled()`."""
    model = runner.model
    layers = decoder_layers(model)
    norm = final_norm(model)
    inputs: dict[int, torch.Tensor] = {}
    mlps: dict[int, torch.Tensor] = {}
    normed: list[torch.Tensor] = []

    def layer_input(index: int) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
            inputs[index] = _last(args[0] if args else kwargs["hidden_states"])

        return hook

    def mlp_output(index: int, takes_residual: bool) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            added = _last(output)
            if takes_residual:  # Bloom and MPT add the residual inside their MLP
                residual = args[1] if len(args) > 1 else kwargs["residual"]
                added = added - _last(residual)
            mlps[index] = added

        return hook

    def norm_input(module: torch.nn.Module, args: Any, output: Any) -> Any:
        inputs[len(layers)] = _last(args[0])
        normed.append(_last(output))

    handles = [norm.register_forward_hook(norm_input)]
    for i, layer in enumerate(layers):
        branch = _mlp_branch_end(layer)
        takes_residual = "residual" in inspect.signature(branch.forward).parameters
        handles.append(layer.register_forward_pre_hook(layer_input(i), with_kwargs=True))
        handles.append(branch.register_forward_hook(mlp_output(i, takes_residual), with_kwargs=True))
    try:
        input_ids = torch.tensor([ids], device=runner.device)
        with layer_by_layer(model, cancelled, progress, what="the logit-difference split"):
            logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits[0, -1]
    finally:
        for handle in handles:
            handle.remove()
    stream = torch.stack([inputs[i] for i in range(len(layers) + 1)])
    return stream, torch.stack([mlps[i] for i in range(len(layers))]), normed[-1], logits


@torch.inference_mode()
def logit_difference(
    runner: ModelAccess,
    ids: list[int],
    a: int,
    b: int,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> LogitDifference:
    """logit(a) − logit(b) after the last of `ids`, split by layer (see the module's docstring)."""
    model = runner.model
    stream, mlp, normed, logits = residual_parts(runner, ids, progress, cancelled)
    frozen = FrozenNorm(final_norm(model), stream[-1], normed)
    layer_total = stream[1:].to(torch.float64) - stream[:-1].to(torch.float64)
    mlp = mlp.to(torch.float64)
    parts = torch.cat([stream[:1].to(torch.float64), layer_total - mlp, mlp])  # embedding, attention, MLP
    weight = model.get_output_embeddings().weight
    # Through the head in the model's dtype (its weights'), then the differences in float64.
    inputs = torch.cat([frozen.linear(parts), torch.zeros_like(frozen.bias)[None], frozen.bias[None]])
    head = head_logits_before_cap(model, inputs.to(weight.dtype))[:, [a, b]].to(torch.float64)
    linear = head[:-2] - head[-2]  # the head's bias taken off each part: what remains is linear
    diff = linear[:, 0] - linear[:, 1]
    biased = head[-1, 0] - head[-1, 1]
    before_cap = head[-1] + linear.sum(0)
    capped = softcap(model, before_cap)
    n = len(mlp)
    own = logits.to(torch.float64)
    return LogitDifference(
        position=len(ids) - 1,
        a_id=a,
        a_text=runner.piece(a),
        b_id=b,
        b_text=runner.piece(b),
        total=float(own[a] - own[b]),
        embedding=float(diff[0]),
        attention=tuple(diff[1 : n + 1].tolist()),
        mlp=tuple(diff[n + 1 :].tolist()),
        bias=float(biased),
        softcap=float((capped[0] - capped[1]) - (before_cap[0] - before_cap[1])),
    )
