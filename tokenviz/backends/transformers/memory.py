"""Will the model fit? Asked of its config alone, before a single weight is allocated.

The weights are counted on torch's meta device (the model built without storage), in the dtype they
will load in; the KV cache for KV_TOKENS positions (or the model's context, if shorter) is added, and
a share for the working memory (activations, logits, kept query states). That is set against what
the device has free, within `--max-memory`. A model that does not fit is refused in one line with the
figures and what would fit, instead of meeting the out-of-memory killer halfway through its loading.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from tokenviz.backends.shared.parts import kv_heads, layer_configs, text_config
from tokenviz.backends.transformers.attention import latent_attention
from tokenviz.contract.errors import ModelLoadError

KV_TOKENS = 4096  # the context whose KV cache is reserved (the model's own, if shorter)
WORKING_SHARE = 0.10  # on top of the weights and KV cache: activations, logits, kept queries
SMALLER = {torch.float32: torch.bfloat16}  # auto dtype on a CPU: float32 unless only this fits
QUANTIZED_BYTES = {"int8": 1.0, "int4": 0.5}  # per weight of a linear layer (scales are the 10% to work in)


@dataclass(frozen=True)
class Need:
    """What a model needs on its device, in bytes."""

    weights: int
    kv: int
    tokens: int
    dtype: torch.dtype
    quantize: str | None = None

    @property
    def total(self) -> int:
        return int((self.weights + self.kv) * (1 + WORKING_SHARE))

    def form(self) -> str:
        return f"{self.quantize} and {dtype_name(self.dtype)}" if self.quantize else dtype_name(self.dtype)

    def describe(self) -> str:
        return (
            f"{gigabytes(self.total)} ({gigabytes(self.weights)} of weights in {self.form()}, "
            f"{gigabytes(self.kv)} of KV cache for {self.tokens:,} tokens, {WORKING_SHARE:.0%} to work in)"
        )


def gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Parameters:
    total: int  # tied ones once
    in_linears: int  # the weights of linear layers but the output head: what weight-only quantization shrinks
    latent_kv: bool = False  # its cache keeps latents, as transformers' code for it does (see attention.attended)


BUILT_LAYERS = 256  # more than any released model has: a config with more is counted from two small builds


def parameter_count(config: Any, trust_remote_code: bool = False) -> Parameters:
    """The model's parameters, counted on the meta device: no storage, so a 70B config costs what
    its modules' Python objects cost. A config of more than BUILT_LAYERS layers (20,000 had taken a
    minute and 2 GB to build) is counted from builds of one and two layers: what a layer adds, times
    the layers, plus what the rest has (the cost of a config is then bounded, whatever it says)."""
    text = text_config(config)
    layers = getattr(text, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= BUILT_LAYERS:
        return _built_count(config, trust_remote_code)
    one, two = (_built_count(_with_layers(config, n), trust_remote_code) for n in (1, 2))
    return Parameters(
        total=one.total + (layers - 1) * (two.total - one.total),
        in_linears=one.in_linears + (layers - 1) * (two.in_linears - one.in_linears),
        latent_kv=one.latent_kv,
    )


def _with_layers(config: Any, n: int) -> Any:
    """A copy of `config` with `n` decoder layers (its per-layer lists cut to them)."""
    copy = config.__class__.from_dict(config.to_dict())
    text = text_config(copy)
    total = text.num_hidden_layers
    for name, value in vars(text).items():
        if isinstance(value, list) and len(value) == total:
            setattr(text, name, value[:n])
    text.num_hidden_layers = n
    return copy


def _built_count(config: Any, trust_remote_code: bool) -> Parameters:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    head = model.get_output_embeddings()
    linears = {
        id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
    }
    return Parameters(sum(p.numel() for p in model.parameters()), sum(linears.values()), latent_attention(model))


def need(config: Any, parameters: Parameters, dtype: torch.dtype, quantize: str | None = None) -> Need:
    text = text_config(config)
    context = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None) or KV_TOKENS
    tokens = min(KV_TOKENS, int(context))
    size = dtype.itemsize
    kv, per_layer = 0, {}  # each config's figure once: a uniform model's layers share one, however many
    for layer in layer_configs(text):
        if id(layer) not in per_layer:
            per_layer[id(layer)] = _kv_per_position(layer, parameters.latent_kv)
        kv += per_layer[id(layer)]
    kv *= tokens * size
    quantized = parameters.in_linears if quantize else 0
    weights = (parameters.total - quantized) * size + quantized * QUANTIZED_BYTES.get(quantize or "", 0)
    return Need(weights=int(weights), kv=kv, tokens=tokens, dtype=dtype, quantize=quantize)


def _kv_per_position(layer: Any, latent_kv: bool) -> int:
    """Numbers one decoder layer's KV cache keeps a position, from that layer's config."""
    latent = getattr(layer, "kv_lora_rank", None) if latent_kv else None
    if latent:  # one latent and one shared rotary key
        return int(latent + (getattr(layer, "qk_rope_head_dim", None) or 0))
    heads = layer.num_attention_heads  # keys and values of every key/value head
    head_dim = getattr(layer, "head_dim", None) or layer.hidden_size // heads
    return int(2 * kv_heads(layer, heads) * head_dim)


def free_bytes(device: torch.device, limits: dict[str, int]) -> tuple[int, bool]:
    """What `device` has free now, and whether `--max-memory` is what limits it."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free = torch.cuda.mem_get_info(index)[0]
        limit = limits.get(f"cuda:{index}", limits.get("cuda"))
    else:  # the CPU, and MPS's memory shared with it
        free = psutil.virtual_memory().available
        limit = limits.get(device.type)
    return (limit, True) if limit is not None and limit < free else (free, False)


def check_fits(
    name: str,
    config: Any,
    parameters: Parameters,
    device: torch.device,
    dtype: torch.dtype,
    auto_dtype: bool,
    limits: dict[str, int],
    spread: bool = False,
    quantize: str | None = None,
) -> tuple[torch.dtype, str]:
    """The dtype to load in (with `auto_dtype` on a CPU, the smaller one when only it fits) and a line
    saying what the model needs of what is free; ModelLoadError when it does not fit. `spread`: a
    device map puts the weights where there is room (the disk last), so only the KV cache must fit."""
    if spread:  # --max-memory is then what the map may put on each device: the KV cache comes on top
        cache = dataclasses.replace(need(config, parameters, dtype, quantize), weights=0)
        free = free_bytes(device, {})[0]
        if cache.total > free:
            raise ModelLoadError(
                f"{name}'s KV cache for {cache.tokens:,} tokens needs {gigabytes(cache.total)} with room to work, "
                f"and {device} has {gigabytes(free)} free"
            )
        return dtype, f"weights placed by the device map; the KV cache needs {gigabytes(cache.total)} on {device}"
    free, limited = free_bytes(device, limits)
    where = f"{device}{' within --max-memory' if limited else ''}"
    wanted = need(config, parameters, dtype, quantize)
    note = ""
    if wanted.total > free and auto_dtype and dtype in SMALLER and device.type == "cpu":
        smaller = need(config, parameters, SMALLER[dtype], quantize)  # refused even so: the figures of the smaller
        note = f"; {dtype_name(smaller.dtype)} because {dtype_name(dtype)} needs {gigabytes(wanted.total)}"
        wanted = smaller
    if wanted.total > free:
        options = {f"--dtype {dtype_name(d)}": need(config, parameters, d, quantize) for d in (torch.bfloat16,)}
        options |= {f"--quantize {q}": need(config, parameters, wanted.dtype, q) for q in QUANTIZED_BYTES}
        fits = [
            f"{option} ({gigabytes(n.total)})"
            for option, n in options.items()
            if (n.dtype, n.quantize) != (wanted.dtype, wanted.quantize) and n.total <= free
        ]
        fits.append("--device-map auto (what does not fit goes to the disk: slower)")
        advice = f": try {' or '.join(fits)}"
        raise ModelLoadError(f"{name} needs {wanted.describe()}, and {where} has {gigabytes(free)} free{advice}")
    return wanted.dtype, f"needs {gigabytes(wanted.total)} of {gigabytes(free)} free on {where}{note}"
