"""Find and load a causal language model: the bundled GGUF, a .gguf path, a directory or a hub id.

A .gguf is dequantised once, a tensor at a time (model/gguf_streaming.py), and saved as safetensors
in the user's cache directory; a manifest written last marks the conversion complete and holds a
digest of the weights, so a stale, half-written or damaged cache is rebuilt. A cache that cannot be
written is skipped: the GGUF is then dequantised in memory on every start.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import re
import shutil
import socket
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenviz.backends.transformers.attention import IMPLEMENTATION, use_fast_attention
from tokenviz.backends.transformers.checkpoint import check_checkpoint
from tokenviz.backends.transformers.device_map import accelerate_limits, check_map_modules, offload_dir_for, placed
from tokenviz.backends.transformers.gguf_streaming import (
    SHARD_BYTES,
    ShardNotWritten,
    largest_tensor_bytes,
    stream_gguf,
)
from tokenviz.backends.transformers.memory import WORKING_SHARE, check_fits, free_bytes, gigabytes, parameter_count
from tokenviz.backends.transformers.parts import kv_heads, layer_configs, text_config
from tokenviz.backends.transformers.quantizing import quantization_config, quantized
from tokenviz.contract.errors import ModelLoadError, TokenvizError
from tokenviz.contract.placement import DEFAULT_PLACEMENT, Placement
from tokenviz.contract.records import ModelInfo
from tokenviz.contract.text import safe_text
from tokenviz.system.paths import bundled_gguf, cache_root
from tokenviz.system.placement_files import resolved

BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled, Q4_1 GGUF)"
MANIFEST = "tokenviz-manifest.json"
MANIFEST_VERSION = 3
DIGEST_BLOCKS = 64  # blocks of the weights file hashed for the manifest's digest
DIGEST_BLOCK_BYTES = 1 << 16
SAVE_SHARE = 0.9  # of the conversion's bar, the tensors' share; saving them takes the rest
HUB_HOST = ("huggingface.co", 443)
HUB_TIMEOUT_S = 3.0

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)
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


def _fingerprint(gguf: Path) -> dict[str, Any]:
    import transformers

    stat = gguf.stat()
    return {
        "version": MANIFEST_VERSION,
        "source": str(gguf.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def gguf_cache_dir(gguf: Path) -> Path:
    key = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def weights_digest(path: Path) -> str:
    """The file's size and a hash of DIGEST_BLOCKS blocks spread evenly through it: cheap to check
    at every start (4 MB read), and any damage wider than the gaps between blocks changes it."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    step = max(size // DIGEST_BLOCKS, DIGEST_BLOCK_BYTES)
    with path.open("rb") as file:
        for offset in range(0, size, step):
            file.seek(offset)
            digest.update(file.read(DIGEST_BLOCK_BYTES))
    return f"{size}:{digest.hexdigest()[:32]}"


def weights_digests(directory: Path) -> dict[str, str]:
    """Each weights file's digest, by name."""
    return {path.name: weights_digest(path) for path in sorted(directory.glob("*.safetensors"))}


def write_manifest(directory: Path, gguf: Path) -> None:
    manifest = {**_fingerprint(gguf), "weights": weights_digests(directory)}
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _cache_is_fresh(directory: Path, gguf: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        digest = manifest.pop("weights")
        return manifest == _fingerprint(gguf) and bool(digest) and digest == weights_digests(directory)
    except (OSError, ValueError, KeyError, AttributeError):
        return False


class CacheNotWritable(ModelLoadError):
    """The model cache cannot be written; the reason is the message (where nothing else can be
    done, as when a damaged cache cannot be rebuilt, it reaches the user as it is)."""


def ensure_converted(gguf: Path, directory: Path, progress: Progress, rebuild: bool = False) -> None:
    """Convert `gguf` into `directory` unless a fresh conversion is there. One process converts at
    a time (a lock file beside the cache); the others wait and then find it done."""
    if _cache_is_fresh(directory, gguf) and not rebuild:
        return
    lock_path = directory.with_name(directory.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path))
        lock.acquire()
    except OSError as exc:
        raise CacheNotWritable(f"the model cache in {lock_path.parent} cannot be written ({exc.strerror})") from None
    try:
        if rebuild or not _cache_is_fresh(directory, gguf):  # another process may have converted it
            with quiet():
                convert_gguf(gguf, directory, progress)
    finally:
        lock.release()


def convert_gguf(gguf: Path, directory: Path, progress: Progress) -> None:
    """Dequantise a .gguf into safetensors under `directory` (the slow, one-time path), a tensor at a
    time: a GGUF whose float32 form fits on the disk converts, whatever the memory."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    message = f"converting {gguf.name} to safetensors once; later starts skip this"
    progress(f"{message}: reading its tokenizer and metadata", None)  # no fraction yet: the bar pulses
    shutil.rmtree(directory, ignore_errors=True)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True, exist_ok=True)
        with _removed_on_failure(partial):
            try:
                with _gguf_read_once():
                    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                    _check_conversion_fits(gguf, config, directory)
                    architecture = stream_gguf(gguf, partial, config, lambda f: progress(message, SAVE_SHARE * f))
            except (ModelLoadError, ShardNotWritten):  # (CacheNotWritable is a ModelLoadError)
                raise
            except Exception as exc:  # the gguf reader raises many types for a damaged file
                raise ModelLoadError(f"could not read GGUF file {gguf}: {one_line(exc)}") from None
            progress(f"{message}: saving", SAVE_SHARE)
            if hasattr(config, "quantization_config"):  # (the weights are plain floats now)
                del config.quantization_config
            config.dtype, config.architectures = torch.float32, [architecture]
            config.save_pretrained(partial)
            GenerationConfig.from_model_config(config).save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            write_manifest(partial, gguf)
            partial.rename(directory)
    except OSError as exc:  # a full disk, a cache made read-only meanwhile
        raise CacheNotWritable(f"the model cache in {directory.parent} could not be written ({exc.strerror})") from None
    prune_orphaned_caches()
    progress("conversion done", 1.0)


@contextlib.contextmanager
def _removed_on_failure(partial: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _check_conversion_fits(gguf: Path, config: Any, directory: Path) -> None:
    """The conversion saves the whole model in float32 on disk, and holds a shard and a tensor in
    memory: refuse a GGUF too large for either before it starts (a 4 GB Q4 file of a 7B model
    becomes 28 GB on disk). Loading it afterwards is checked like any model directory."""
    size = parameter_count(config).total * torch.float32.itemsize
    held = min(size, SHARD_BYTES) + 2 * largest_tensor_bytes(gguf)  # (dequantised, then copied)
    memory = free_bytes(torch.device("cpu"), {})[0]
    directory.parent.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(directory.parent).free
    if held * (1 + WORKING_SHARE) > memory:
        raise ModelLoadError(
            f"converting {gguf.name} dequantises it to {gigabytes(size)} of float32 weights on disk, holding "
            f"{gigabytes(held)} in memory, and there are {gigabytes(memory)} of memory free: a GGUF this large "
            "cannot be opened here"
        )
    if size > disk:  # (as a cache that cannot be written: the GGUF is read in memory instead, if that fits)
        raise CacheNotWritable(
            f"the model cache in {directory.parent} has {gigabytes(disk)} free, and {gguf.name} takes "
            f"{gigabytes(size)} as float32 safetensors"
        )


def prune_orphaned_caches() -> list[Path]:
    """Remove converted models whose .gguf no longer exists, and conversions a killed process left
    half done (a `.partial` whose lock no process holds). The cache is keyed by the file's path, so
    each deleted virtual environment would otherwise leave its conversion (0.5 GB) behind."""
    removed = []
    for directory in sorted((cache_root() / "models").glob("*")):
        if directory.suffix == ".partial":
            if _unlocked(directory.with_suffix(".lock")):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
            continue
        try:
            source = json.loads((directory / MANIFEST).read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a finished conversion of ours: leave it
        if isinstance(source, str) and not Path(source).exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _unlocked(lock_path: Path) -> bool:
    """Whether no process is converting under `lock_path` now."""
    try:
        with FileLock(str(lock_path), timeout=0):
            return True
    except (OSError, TimeoutError):  # filelock's Timeout is a TimeoutError
        return False


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers reads the GGUF's metadata three times (tokenizer, config, weights: about 5 s each
    for the bundled model) and rebuilds gguf's tensor-name map once per module (397 times). For the
    length of one conversion, each is built once and shared."""
    import copy

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint)
    readers: dict[str, object] = {}
    metadata: dict[str, dict[str, Any]] = {}

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return originals[0](path, *args, **kwargs)
        if str(path) not in readers:
            readers[str(path)] = originals[0](path)
        return readers[str(path)]

    def checkpoint(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return originals[2](path, return_tensors=return_tensors, **kwargs)  # type: ignore[no-untyped-call]
        if str(path) not in metadata:
            metadata[str(path)] = originals[2](path, return_tensors=False)  # type: ignore[no-untyped-call]
        return copy.deepcopy(metadata[str(path)])  # callers change what they get

    gguf.GGUFReader = reader  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(originals[1])
    gguf_utils.load_gguf_checkpoint = checkpoint  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = originals  # type: ignore[misc]


def one_line(exc: BaseException) -> str:
    """The first line of what an error says (its name where it says nothing)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers and tqdm print warnings and bars to the terminal the TUI owns."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.redirect_stderr(io.StringIO()):
                yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()


def _position_scheme(config: Any) -> str:
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(config, "rope_theta", None)
    if theta is not None:
        return f"rotary (base {theta:g})"
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return f"learned absolute ({n} positions)"


ATTENTION_LABELS = {
    True: "sdpa; the weights shown are computed exactly when asked",
    False: "eager: transformers has no fast path for this model's attention",
}


def model_info(
    model: Any,
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    memory: str = "",
    placement: str = "",
    quantization: str = "",
) -> ModelInfo:
    c = model.config
    first = layer_configs(c)[0]  # (the runner reads the first layer's cache shape: the same figures)
    heads = first.num_attention_heads
    hidden = c.hidden_size
    return ModelInfo(
        name=name,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        layers=c.num_hidden_layers,
        heads=heads,
        kv_heads=kv_heads(first, heads),
        head_dim=getattr(first, "head_dim", None) or hidden // heads,
        hidden=hidden,
        vocab=c.vocab_size,
        context=int(getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 2048),
        architecture=type(model).__name__,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        positions=_position_scheme(c),
        attention=ATTENTION_LABELS[c._attn_implementation == IMPLEMENTATION],
        memory=memory,
        placement=placement,
        quantization=quantization,
        experts=routed_experts(c),
    )


EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")  # as families name it


def routed_experts(config: Any) -> int:
    """The routed experts of each mixture-of-experts layer, as the config says (0 for a dense model)."""
    text = text_config(config)
    for name in EXPERT_COUNTS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


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
        gguf = bundled_gguf() if spec is None else Path(spec).expanduser()
        if not gguf.is_file():
            raise ModelLoadError(f"no such GGUF file: {spec}")
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
        _check_hub(spec)  # (before anything is said of fitting: an unreachable hub is the answer)

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
            # A cache that passed its manifest check but does not load: rebuild it once.
            ensure_converted(gguf, directory, progress, rebuild=True)
            with quiet():
                model, tokenizer = _from_pretrained(
                    source, name, fit, trust_remote_code, progress, None, before_weights
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
        placement = resolved(placement)  # (its files read and checked, unless the command line did)
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
    with _gguf_read_once() if gguf_file else contextlib.nullcontext():
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
    if "unrecognized" in lowered or "not supported" in lowered or "should contain" in lowered:
        return f"{spec} is not a causal language model transformers can load ({text})"
    return f"could not load model {spec!r}: {text}"


def load_tokenizer(source: str) -> Any:
    """A tokenizer alone (a Hugging Face id or directory): a served model's, to tokenize with here. One
    line where it cannot load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as exc:
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelLoadError(f"cannot load the tokenizer {safe_text(source)}: {safe_text(said)[:200]}") from None
