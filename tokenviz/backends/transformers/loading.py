"""Find and load a causal language model: the bundled GGUF, a .gguf path, a directory or a hub id.

A .gguf is converted once into the cache (gguf_cache.py) and loaded from there; a cache that cannot be
written is skipped: the GGUF is then dequantised in memory on every start. What the model is, as the
model view says it, is model_description.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenviz.backends.shared.checkpoint import check_checkpoint
from tokenviz.backends.shared.parts import text_config
from tokenviz.backends.transformers.attention import use_fast_attention
from tokenviz.backends.transformers.device_map import accelerate_limits, check_map_modules, offload_dir_for, placed
from tokenviz.backends.transformers.gguf_cache import (
    CacheNotWritable,
    Progress,
    ensure_converted,
    gguf_cache_dir,
    gguf_read_once,
)
from tokenviz.backends.transformers.memory import check_fits, parameter_count
from tokenviz.backends.transformers.model_description import model_info
from tokenviz.backends.transformers.quantizing import quantization_config, quantized
from tokenviz.backends.transformers.quiet import one_line, quiet
from tokenviz.contract.errors import ModelLoadError, TokenvizError
from tokenviz.contract.placement import DEFAULT_PLACEMENT, Placement
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.text import safe_text
from tokenviz.files.gguf_header import read_gguf_header
from tokenviz.system.model_directory import check_model_directory
from tokenviz.system.paths import BUNDLED_NAME, bundled_gguf
from tokenviz.system.placement_files import resolved

HUB_HOST = ("huggingface.co", 443)
HUB_TIMEOUT_S = 3.0

BeforeWeights = Callable[[Any, PreTrainedTokenizerBase], None]  # given (config, tokenizer); raises to refuse


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    info: ModelInfo
    # With --compile: its decode step compiled, a model.compiled_step.CompiledStep (that module imports this one).
    compiled: Any = None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"unknown device {device!r}: choose auto, cpu, cuda or mps")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            "--device cuda asked for, but torch sees no CUDA GPU (is a CUDA build of torch installed?)"
        )
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("--device mps asked for, but MPS is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.float32
    if dtype not in choices:
        raise ModelLoadError(f"unknown dtype {dtype!r}: choose auto, float32, bfloat16 or float16")
    return choices[dtype]


def _gguf_file(spec: str | None) -> Path:
    """The GGUF `spec` names (None: the bundled one); a header that lies, or hyperparameters no model has,
    is one line here, before a weight is read."""
    if spec is None:
        return bundled_gguf()
    gguf = Path(spec).expanduser()
    if not gguf.is_file():
        raise ModelLoadError(f"no such GGUF file: {spec}")
    read_gguf_header(gguf)
    return gguf


def load_model(
    spec: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    progress: Progress = lambda message, fraction: None,
    placement: Placement = DEFAULT_PLACEMENT,
    before_weights: BeforeWeights | None = None,
) -> LoadedModel:
    """Load `spec` (None = the bundled model), ready for inference (see this backend's attention),
    placed as `placement` says (see its memory and device_map modules). `before_weights` is given the
    config and the tokenizer before a weight is read: what it refuses costs no load."""
    torch_device = resolve_device(device)
    fit = Fit.of(torch_device, dtype, placement)

    gguf_file = None
    if spec is None or spec.endswith(".gguf"):
        gguf = _gguf_file(spec)
        directory = gguf_cache_dir(gguf)
        name = BUNDLED_NAME if spec is None else gguf.name
        try:
            ensure_converted(gguf, directory, progress)
            source = str(directory)
        except CacheNotWritable as exc:
            progress(f"{exc}: reading {gguf.name} in memory, on every start (set XDG_CACHE_HOME to cache it)", None)
            source, gguf_file = str(gguf.parent), gguf.name
    elif Path(spec).expanduser().is_dir():
        source, name = str(Path(spec).expanduser()), spec
        _check_model_directory(Path(source), spec)
    elif Path(spec).expanduser().exists():
        raise ModelLoadError(f"{spec} is a file, not a model directory or a .gguf file")
    elif spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelLoadError(f"no such model path: {spec}")
    else:
        source, name = spec, spec
        _check_hub(spec)  # before anything is said of fitting: an unreachable hub is the answer

    progress(f"checking that {name} fits on {torch_device}", None)
    fit.offload_dir = placement.offload_dir or str(offload_dir_for(source if gguf_file is None else gguf_file))
    try:
        with quiet():
            model, tokenizer = _from_pretrained(
                source, name, fit, trust_remote_code, progress, gguf_file, before_weights
            )
    except TokenvizError:
        raise
    except Exception as exc:
        if (spec is None or spec.endswith(".gguf")) and gguf_file is None:
            ensure_converted(gguf, directory, progress, rebuild=True)
            model, tokenizer = _from_rebuilt_cache(
                name, lambda: _from_pretrained(source, name, fit, trust_remote_code, progress, None, before_weights)
            )
        elif Path(source).is_dir():
            raise ModelLoadError(f"could not load the model directory {spec}: {one_line(exc)}") from None
        else:
            raise ModelLoadError(_explain(name, exc)) from None
    if not fit.placed_as_it_loads:
        model.to(torch_device)
    model.eval()
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or tokenizer.eos_token_id
    info = model_info(model, name, torch_device, fit.dtype, fit.note, placed(model), quantized(model))
    return LoadedModel(model=model, tokenizer=tokenizer, info=info)


def _from_rebuilt_cache(name: str, load: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """A GGUF whose dequantized cache passed its manifest check but did not load, loaded again from the
    cache rebuilt: what fails now is the file itself as transformers reads it, said in one line."""
    try:
        with quiet():
            return load()
    except TokenvizError:
        raise
    except Exception as exc:
        raise ModelLoadError(_explain(name, exc)) from None


def check_vocabulary(name: str, config: Any, tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse a config whose vocabulary is smaller than its tokenizer's own (not counting the tokens
    added to it, which a model may leave without embeddings: a prompt holding one is refused then)."""
    text = text_config(config)
    vocab, tokens = getattr(text, "vocab_size", None), getattr(tokenizer, "vocab_size", None)
    if isinstance(vocab, int) and isinstance(tokens, int) and vocab < tokens:
        raise ModelLoadError(
            f"{name}'s config has a vocabulary of {vocab:,} and its tokenizer {tokens:,} tokens: ids from "
            f"{vocab:,} on would have no embedding (a config and a tokenizer that do not belong together?)"
        )


ATTENTION_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}


def require_attention(config: Any, source: str) -> None:
    """Refuse a model whose layers are not all attention (state-space, recurrent or linear-attention
    layers): tokenviz follows attention layer by layer and keeps a KV cache."""
    kinds = set(getattr(config, "layer_types", None) or ())
    if not getattr(config, "num_attention_heads", None) or kinds - ATTENTION_LAYERS:
        raise ModelLoadError(
            f"{source} is a {config.model_type!r} model whose layers are not all attention (a state-space or "
            "recurrent model); tokenviz follows attention layer by layer, so it needs a transformer"
        )


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


def _check_model_directory(directory: Path, spec: str) -> None:
    check_model_directory(directory, f"the model directory {safe_text(spec)}")
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"could not load model {spec!r}: the directory has no config.json (not a Hugging Face model directory)"
        )
    if not any(next(directory.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ModelLoadError(
            f"could not load model {spec!r}: the directory has a config.json but no weights (*.safetensors or *.bin)"
        )


@dataclass
class Fit:
    """Where the model goes and in what dtype; `note` says what it needs of what is free (see
    tokenviz.backends.transformers.memory), once the config has been checked."""

    device: torch.device
    dtype: torch.dtype
    auto_dtype: bool
    limits: dict[str, int]
    mapping: str | dict[str, str | int] | None = None  # a device map (see tokenviz.backends.transformers.device_map)
    quantize: str | None = None
    offload_dir: str = ""
    note: str = ""

    @staticmethod
    def of(device: torch.device, dtype: str, placement: Placement) -> Fit:
        auto = dtype == "auto"
        placement = resolved(placement)  # its files read and checked, unless the command line did
        return Fit(device, resolve_dtype(dtype, device), auto, placement.limits, placement.mapping, placement.quantize)

    @property
    def placed_as_it_loads(self) -> bool:
        """Whether transformers puts the weights on their devices (else the model moves after)."""
        return self.mapping is not None or self.device.type != "cpu" or self.quantize is not None

    def placing(self) -> dict[str, Any]:
        """from_pretrained's arguments for the device map and the quantization, if any. Off the CPU
        the weights go straight onto the device, not through the host first."""
        where: dict[str, Any] = {}
        if self.mapping is not None:
            limits = accelerate_limits(self.limits) or None
            where = {"device_map": self.mapping, "max_memory": limits, "offload_folder": self.offload_dir}
        elif self.placed_as_it_loads:
            where = {"device_map": {"": str(self.device)}}
        if self.quantize:
            where["quantization_config"] = quantization_config(self.quantize, self.device, self.dtype)
        return where


def _from_pretrained(
    source: str,
    name: str,
    fit: Fit,
    trust_remote_code: bool,
    progress: Progress,
    gguf_file: str | None = None,
    before_weights: BeforeWeights | None = None,
) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    where = {"trust_remote_code": trust_remote_code, **({"gguf_file": gguf_file} if gguf_file else {})}
    with gguf_read_once() if gguf_file else contextlib.nullcontext():
        config = AutoConfig.from_pretrained(source, **where)
        if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
            raise ModelLoadError(f"{source} is a {config.model_type!r} model, not a causal language model")
        require_attention(config, source)
        if Path(source).is_dir():
            check_checkpoint(Path(source), name, config)
        parameters = parameter_count(config, trust_remote_code)
        if isinstance(fit.mapping, dict):
            check_map_modules(name, config, fit.mapping, trust_remote_code)
        fit.dtype, fit.note = check_fits(
            name,
            config,
            parameters,
            fit.device,
            fit.dtype,
            fit.auto_dtype,
            fit.limits,
            fit.mapping is not None,
            fit.quantize,
        )
        progress(f"loading {name} on {fit.device} ({str(fit.dtype).removeprefix('torch.')}): {fit.note}", None)
        tokenizer = AutoTokenizer.from_pretrained(source, **where)
        check_vocabulary(name, config, tokenizer)
        if before_weights is not None:
            before_weights(config, tokenizer)
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            source, dtype=fit.dtype, attn_implementation="eager", output_loading_info=True, **fit.placing(), **where
        )
    model, report = loaded
    if gguf_file:  # dequantised in memory: plain floats, as a conversion would have saved them
        model.hf_quantizer = None
    else:
        check_weights(name, report)
    use_fast_attention(model)
    return model, tokenizer


def check_weights(name: str, report: dict[str, Any]) -> None:
    """Refuse a checkpoint that lacks weights the architecture needs, or holds ones it does not use:
    transformers would fill the missing ones with random numbers and say so only in a warning.
    (Tied weights and the buffers a model makes itself are not in its report.)"""
    missing, unexpected = set(report.get("missing_keys") or ()), set(report.get("unexpected_keys") or ())
    mismatched = {entry[0] for entry in report.get("mismatched_keys") or ()}
    parts = [
        f"{what} {len(keys)} weight{'s' if len(keys) != 1 else ''} ({_kinds(keys)})"
        for what, keys in (("lacks", missing), ("has the wrong shape for", mismatched), ("has", unexpected))
        if keys
    ]
    if parts:
        if unexpected:
            parts[-1] += " the model does not use"
        raise ModelLoadError(f"{name}: its checkpoint {' and '.join(parts)}; is it the checkpoint of this config?")


def _kinds(keys: set[str], shown: int = 3) -> str:
    """Weight names with their layer numbers folded: model.layers.*.mlp.up_proj.weight, …"""
    kinds = sorted({re.sub(r"\.\d+\.", ".*.", key) for key in keys})
    more = f", and {len(kinds) - shown} more kinds" if len(kinds) > shown else ""
    return ", ".join(safe_text(kind) for kind in kinds[:shown]) + more


def _check_hub(model_id: str) -> None:
    """A hub id that is not in the local cache needs the hub: without a network, say so at once
    rather than after huggingface_hub's retries (about 30 s)."""
    from huggingface_hub import try_to_load_from_cache

    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    if offline or isinstance(try_to_load_from_cache(model_id, "config.json"), str):
        return
    try:
        socket.create_connection(HUB_HOST, timeout=HUB_TIMEOUT_S).close()
    except OSError:
        raise ModelLoadError(
            f"could not load model {model_id!r}: not a local directory or .gguf file, not in the Hugging Face "
            "cache, and the hub cannot be reached from here"
        ) from None


def _explain(spec: str, exc: Exception) -> str:
    text = one_line(exc)
    lowered = text.lower()
    if "trust_remote_code" in lowered:
        return f"{spec} needs custom code: pass --trust-remote-code if you trust it"
    if any(
        w in lowered
        for w in (
            "offline",
            "connect",
            "resolve",
            "not a valid model identifier",
            "does not appear to have",
            "couldn't",
            "could not",
            "repository not found",
            "cannot find",
            "404",
            "local_files_only",
        )
    ):
        return (
            f"could not load model {spec!r}: not a local directory or .gguf file, and not found on the "
            f"Hugging Face hub or in its local cache ({text})"
        )
    if "mismatched_sizes" in lowered:  # (transformers' report of the weights' shapes is in its log, kept quiet)
        return (
            f"transformers could not read {spec}: the shapes of its weights differ from those of the model "
            "transformers builds from its metadata (transformers does not read this file as it was written)"
        )
    if "unrecognized" in lowered or "not supported" in lowered or "should contain" in lowered:
        return f"{spec} is not a causal language model transformers can load ({text})"
    return f"could not load model {spec!r}: {text}"
