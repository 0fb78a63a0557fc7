"""Fast attention for the work, exact weights for the view.

Forward passes run through one attention function registered with transformers' AttentionInterface:
it calls sdpa (or the model's own eager code where sdpa cannot serve, as with soft-capping), and,
while a runner captures, keeps each layer's query states. A row of attention weights is then
computed when a pane asks, from the kept queries and the keys in the KV cache, by the model's own
eager attention code: scaling, soft-capping, grouped keys and sinks are the model's; the mask
(causal, and the layer's sliding window) is the one transformers builds for it.

Families whose attention does not go through the interface (ALiBi, and older code) run eager
attention, and their rows come from an eager forward pass of the rows asked for.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

IMPLEMENTATION = "tokenviz"
_capture: ContextVar[Capture | None] = ContextVar("tokenviz_capture", default=None)
# A compiled step's query states, layer after layer, as torch.compile traces it (a context variable is
# beyond what it traces): the compiled function takes them as its output (see model.compiled_step).
compiled_queries: list[torch.Tensor] = []


@dataclass
class LayerCall:
    """What one layer's attention needs besides queries and keys: its module and its arguments."""

    module: torch.nn.Module
    kwargs: dict[str, Any]


@dataclass
class Capture:
    """The query states of one forward pass, layer by layer, and how each layer calls attention."""

    eager: bool = False  # run the model's eager code in every layer, so the weights are returned
    queries: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (heads, positions kept, head_dim)
    calls: dict[int, LayerCall] = field(default_factory=dict)  # filled once per layer (see capturing)
    # Where each layer's keys were, as its call was recorded: a layer that shares another's cached keys
    # (Gemma 3n's last layers) reads that layer's storage (see ModelRunner's cache_layers).
    key_addresses: dict[int, int] = field(default_factory=dict)
    # The positions of each layer's queries kept, the last ones: a long pass keeps no more than its store's
    # budget holds, and lets the rest go with the layer (None: all).
    keep_last: int | None = None


def _eager_of(module: torch.nn.Module) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The eager attention function of the module's own modeling file."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as eager
    return cast(Callable[..., tuple[torch.Tensor, torch.Tensor]], eager)


def _attend(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function: sdpa where it serves, the model's eager code elsewhere."""
    if torch.compiler.is_compiling():
        compiled_queries.append(query[0])
        capture = None
    else:
        capture = _capture.get()
    if capture is not None and capture.eager:
        return _eager_of(module)(module, query, key, value, _additive(attention_mask, query, key), **kwargs)
    if capture is not None:
        layer = module.layer_idx
        capture.queries[layer] = _kept(query[0], capture.keep_last)
        if layer not in capture.calls:
            capture.calls[layer] = LayerCall(module, {k: v for k, v in kwargs.items() if k in CALL_KWARGS})
            capture.key_addresses[layer] = key.data_ptr()
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None:
        mask = _additive(attention_mask, query, key)
        return _eager_of(module)(module, query, key, value, mask, **kwargs)
    if query.is_cuda and _lower_right(attention_mask, key):
        from torch.nn.attention.bias import causal_lower_right  # here: importing it imports torch._dynamo, 1 s

        attention_mask = causal_lower_right(query.shape[-2], key.shape[-2])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


# Marks a mask that is plainly causal over keys ending at the last query (see _mask).
LOWER_RIGHT = "tokenviz_lower_right_causal"


def _lower_right(mask: torch.Tensor | None, key: torch.Tensor) -> bool:
    """Whether `mask` is marked causal from the bottom right (see _mask), over these keys."""
    return mask is not None and getattr(mask, LOWER_RIGHT, False) and mask.shape[-1] == key.shape[-2]


def _mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """sdpa's mask (transformers' own), marked where it is plainly causal over keys that end with the
    last query: the pass of a prompt's later chunk (or any pass of several tokens) over the cache before
    it. On a GPU _attend then hands sdpa that mask as a causal bias aligned to the bottom right, which
    runs the flash kernel, where the mask itself runs the masked kernel (the bundled model's second
    2,048-token chunk of a 4,096-token prompt on an H200: 9.9 ms against 3.6 ms for the whole prompt).
    Not marked: a padding mask, a window, an offset, a mask function of the model's own, a static cache
    (whose keys run past the queries), a traced pass."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    mask: torch.Tensor | None = sdpa_mask(*args, **kwargs)
    q_length, kv_length, q_offset = kwargs.get("q_length"), kwargs.get("kv_length"), kwargs.get("q_offset", 0)
    if (
        isinstance(mask, torch.Tensor)
        and not args
        and not torch.compiler.is_compiling()
        and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
        and kwargs.get("attention_mask") is None
        and kwargs.get("local_size") is None
        and kwargs.get("kv_offset", 0) == 0
        and type(q_offset) is int
        and type(q_length) is int
        and q_length > 1
        and q_offset + q_length == kv_length
    ):
        setattr(mask, LOWER_RIGHT, True)
    return mask


def _kept(query: torch.Tensor, last: int | None) -> torch.Tensor:
    """The query states (heads, positions, head_dim) to keep: the `last` positions (a copy of their own,
    so the rest goes with the layer), or all of them (see _own)."""
    if last is not None and query.shape[-2] > last:
        return query[:, -last:].clone()
    return _own(query)


def _own(query: torch.Tensor) -> torch.Tensor:
    """The query states to keep: themselves where they are all their storage holds (after RoPE, a
    tensor of their own), a copy where they are a view of more (a fused projection, as GPT-2's), so
    the rest is not kept alive. (A copy per layer per step is a kernel launch: on a GPU, where a
    step waits on the host's launches, 30 of them cost the bundled model about 0.6 ms.)"""
    if query.untyped_storage().nbytes() <= query.numel() * query.element_size():
        return query
    return query.clone()


def _additive(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """sdpa's mask (True = attend, or None for plainly causal) as the additive mask eager code adds."""
    if mask is not None and mask.dtype != torch.bool:
        return mask
    keys, rows = key.shape[-2], query.shape[-2]
    if mask is None:
        return window_mask(range(keys - rows, keys), keys, None, query.dtype, query.device)
    return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
        ~mask, torch.finfo(query.dtype).min
    )


# The arguments a layer passes to attention that shape its weights (the rest are per call).
CALL_KWARGS = frozenset({"scaling", "softcap", "s_aux", "sliding_window", "dropout"})


def use_fast_attention(model: Any) -> bool:
    """Switch `model` to tokenviz's attention function; False (and eager attention) where the
    model's attention does not go through transformers' AttentionInterface."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    # cuDNN's attention builds an execution plan for every new key length: about 1 ms of host time
    # per layer per step (the bundled model on an H100: a step at 2048 tokens took 64.5 ms with it,
    # 27.2 ms without, the bare forward 29 ms). sdpa's other kernels serve the same calls.
    torch.backends.cuda.enable_cudnn_sdp(False)
    AttentionInterface.register(IMPLEMENTATION, _attend)
    # sdpa's masks: None where plainly causal, so sdpa runs its causal kernel (see _additive), and
    # marked where causal from the bottom right (see _mask).
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, _mask)
    if not getattr(model, "_supports_attention_backend", False):
        model.set_attn_implementation("eager")
        return False
    model.set_attn_implementation(IMPLEMENTATION)
    return True


@contextmanager
def capturing(
    eager: bool = False, calls: dict[int, LayerCall] | None = None, keep_last: int | None = None
) -> Iterator[Capture]:
    """Keep the query states of the forward passes run inside (in this thread only), of the `keep_last`
    positions fed last if given; with `eager`, run every layer's eager code instead, so
    `output_attentions` returns the weights. `calls` are the layers' calls known already (a runner's):
    only the missing ones are recorded into it."""
    capture = Capture(eager=eager, calls={} if calls is None else calls, keep_last=keep_last)
    token = _capture.set(capture)
    try:
        yield capture
    finally:
        _capture.reset(token)


def window_mask(
    queries: range, keys: int, window: int | None, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """The additive mask transformers applies: a query at q reads keys k <= q, and within a sliding
    window of w only those with k > q - w. Shape (1, 1, queries, keys)."""
    q = torch.arange(queries.start, queries.stop, device=device)[:, None]
    k = torch.arange(keys, device=device)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def exact_weights(
    call: LayerCall, queries: torch.Tensor, rows: range, keys: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """The attention weights (heads, rows, keys) of query states `queries` (heads, rows, head_dim)
    at positions `rows`, over the cached `keys` and `values` (kv heads, positions, head_dim), computed
    by the layer's own eager attention code."""
    keys, values = attended(call.module, keys, values)
    kwargs = dict(call.kwargs)
    mask = window_mask(rows, keys.shape[-2], kwargs.get("sliding_window"), queries.dtype, queries.device)
    kwargs["dropout"] = 0.0
    _, weights = _eager_of(call.module)(call.module, queries[None], keys[None], values[None], mask, **kwargs)
    return weights[0]


def latent_attention(model: torch.nn.Module) -> bool:
    """Whether the model's cache keeps compressed latents that its layers expand (see `attended`)."""
    return any(hasattr(module, "expand_kv") for module in model.modules())


def attended(module: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values a layer attends over, from what its cache layer holds (kv heads, positions,
    dim): the same tensors, except under multi-head latent attention (DeepSeek V2 and V3, and the
    families built like them), whose cache holds the compressed latent and the shared rotary key,
    expanded into every head's keys and values by the layer's own `expand_kv`."""
    expand = getattr(module, "expand_kv", None)
    if expand is None:
        return keys, values
    keys, values = expand(keys[None], values[None])
    return keys[0], values[0]
