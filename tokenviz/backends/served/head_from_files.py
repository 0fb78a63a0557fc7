"""A served model's own final norm, output head and input embeddings, read here from its files alone.

The lens reads a layer's residual stream as the model reads its last: through the final norm and the
unembedding. The server does not send those, so they come from the model's directory (--tokenizer DIR):
its config builds the model with no weights (accelerate's empty weights), and only the tensors of those
modules are read from its safetensors, never the rest. The modules are the model's own (transformers'
code for its family: Gemma's 1 + weight norm, soft-capping, logit scales), so the lens is the local
lens's computation (backends.shared.output_head) on the server's residuals.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import torch

from tokenviz.backends.shared.checkpoint import weight_files
from tokenviz.backends.shared.output_head import final_norm, head_logits, stream_merge, submodule
from tokenviz.backends.shared.parts import text_config
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text
from tokenviz.files.safetensors_header import TensorEntry, read_header
from tokenviz.system.model_directory import check_model_directory
from tokenviz.system.reading import parse_json, read_file

# Bounds on a config the lens builds a model from (no released model comes near them): past them a
# hostile config would divide by zero or build a million layers before a tensor is read.
MAX_LAYERS = 1024
MAX_HEADS = 4096
MAX_HIDDEN = 1 << 17
MAX_VOCAB = 1 << 22
MAX_CONFIG_BYTES = 16 << 20
HEAD_MEMORY_SHARE = 0.5  # of the memory free now: the most the head's float32 tensors may take


class OutputHead:
    """The model's final norm, output head and input embeddings (float32, on the CPU)."""

    def __init__(self, directory: Path):
        name = safe_text(str(directory))
        config, model = _built(directory, name)
        if stream_merge(model) is not None:
            raise TokenvizError(f"the lens of a served {type(model).__name__} is not read here (its parallel streams)")
        self.model = model
        self.config = text_config(config)
        self.norm = final_norm(model)
        modules = {"norm": self.norm, "head": model.get_output_embeddings(), "embed": model.get_input_embeddings()}
        project_out = submodule(model, ("project_out",))
        if project_out is not None:
            modules["project_out"] = project_out
        names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        wanted = {f"{names[id(m)]}.{p}": (m, p) for m in modules.values() for p, _ in m.named_parameters()}
        tied = f"{names[id(modules['embed'])]}.weight"
        found = _located(directory, name)
        chosen: dict[str, str] = {}  # each parameter's name in the checkpoint
        for key, (module, attribute) in wanted.items():
            stored = next((k for k in _spellings(key) if k in found), None)
            if (
                stored is None
                and key.startswith(names[id(modules["head"])])
                and getattr(config, "tie_word_embeddings", True)
            ):
                stored = next((k for k in _spellings(tied) if k in found), None)  # tied: the embeddings' rows
            if stored is None:
                raise TokenvizError(f"the lens needs {key} from {name}'s safetensors, which do not hold it")
            expected = tuple(getattr(module, attribute).shape)
            held = found[stored][1].shape
            if held != expected:
                raise TokenvizError(
                    f"{name}'s {safe_text(stored)[:80]} is {list(held)} where its config makes it {list(expected)}"
                )
            chosen[key] = stored
        _check_memory({found[k][1].shape for k in chosen.values()}, name)
        for key, (module, attribute) in wanted.items():
            stored = chosen[key]
            value = _read_tensor(directory / found[stored][0], stored, name)
            setattr(module, attribute, torch.nn.Parameter(value, requires_grad=False))
        for module in modules.values():
            for buffer_name, buffer in module.named_buffers(recurse=True):  # real: empty weights keep buffers
                if buffer.is_meta:
                    raise TokenvizError(f"the lens cannot rebuild {buffer_name} of {name}'s model here")
        self.layers = int(self.config.num_hidden_layers)
        self.vocab = int(modules["head"].weight.shape[0])
        self.hidden = int(modules["embed"].weight.shape[1])
        self.embeddings = modules["embed"]

    @torch.inference_mode()
    def logits(self, residual: torch.Tensor) -> torch.Tensor:
        """The model's output logits had it stopped with this residual stream (…, hidden)."""
        return head_logits(self.model, self.norm(residual.float()))

    @torch.inference_mode()
    def output_rows(self, ids: list[int]) -> np.ndarray:
        """The unembedding's rows of `ids` (ids, hidden), float32: what steering by tokens adds."""
        weight: torch.Tensor = self.model.get_output_embeddings().weight
        return weight[ids].float().numpy()

    @torch.inference_mode()
    def embed(self, ids: list[int]) -> torch.Tensor:
        """The input embeddings of `ids` as the first layer receives them (positions, hidden)."""
        rows: torch.Tensor = self.embeddings(torch.tensor(ids))
        return rows.float()


def _spellings(key: str) -> tuple[str, ...]:
    """How a checkpoint may name a parameter: as the model does, or without (or with) the base's prefix."""
    head, _, rest = key.partition(".")
    return (key, rest, f"model.{key}") if head == "model" else (key, f"model.{key}")


def checked_files(directory: Path) -> Any:
    """The config of the model in `directory`, its files and its shape checked (before its tokenizer or
    its model is built from them, either of which reads the config)."""
    from transformers import AutoConfig

    name = safe_text(str(directory))
    check_model_directory(directory, f"--tokenizer {name}")
    raw = parse_json(read_file(directory / "config.json", MAX_CONFIG_BYTES, f"{name}'s config.json"), "config.json")
    if isinstance(raw, dict):  # as written, before transformers divides by its numbers
        _check_config(SimpleNamespace(**(raw.get("text_config") or raw)), name, given_only=True)
    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # a config is the user's file: whatever it makes transformers raise
        raise TokenvizError(f"the lens cannot read {name}'s config: {_first_line(exc)}") from None
    _check_config(text_config(config), name)
    return config


def _built(directory: Path, name: str) -> tuple[Any, Any]:
    """The config and the model it makes, with no weights (accelerate's empty weights: parameters on the
    meta device, nothing allocated, nothing read), the config's shape checked first."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    config = checked_files(directory)
    try:
        with init_empty_weights():
            return config, AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # a config is the user's file: whatever it makes transformers raise
        raise TokenvizError(f"the lens cannot build {name}'s model from its config: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return safe_text((str(exc).strip().splitlines() or [type(exc).__name__])[0])[:160]


def _located(directory: Path, name: str) -> dict[str, tuple[str, TensorEntry]]:
    """Each tensor's name in the directory's safetensors, to its file and entry (read from their
    headers alone, with bounds: files.safetensors_header)."""
    shards = weight_files(directory, name)  # each checked to lie inside the directory
    if not shards:
        raise TokenvizError(f"the lens needs {name}'s weights as safetensors, and it has none")
    located: dict[str, tuple[str, TensorEntry]] = {}
    for shard in shards:
        header = read_header(directory / shard, f"{name}'s {safe_text(shard)[:80]}")
        located.update({key: (shard, entry) for key, entry in header.items()})
    return located


def _check_config(config: Any, name: str, given_only: bool = False) -> None:
    """Refuse a config whose shape no model has, before a model is built from it (`given_only`: only
    the fields it holds, as a config file may leave some to its family's defaults)."""
    bounds = {
        "num_hidden_layers": MAX_LAYERS,
        "num_attention_heads": MAX_HEADS,
        "hidden_size": MAX_HIDDEN,
        "vocab_size": MAX_VOCAB,
    }
    for field, most in bounds.items():
        value = getattr(config, field, None)
        if given_only and value is None:
            continue
        if type(value) is not int or not 1 <= value <= most:
            raise TokenvizError(
                f"{name}'s config says {field} {safe_text(str(value))[:40]}: a model's lies within 1 to {most:,}"
            )
    for field in ("num_key_value_heads", "head_dim"):
        value = getattr(config, field, None)
        if value is not None and (type(value) is not int or not 1 <= value <= MAX_HIDDEN):
            raise TokenvizError(f"{name}'s config says {field} {safe_text(str(value))[:40]}: not a count of heads")


def _check_memory(shapes: set[tuple[int, ...]], name: str) -> None:
    """Refuse tensors whose float32 copies would take more than a share of the memory free now."""
    need = sum(math.prod(shape) * 4 for shape in shapes)
    free = psutil.virtual_memory().available
    if need > free * HEAD_MEMORY_SHARE:
        raise TokenvizError(
            f"the lens's head of {name} needs {need / 1e9:.1f} GB as float32 and {free / 1e9:.1f} GB is free: "
            "free memory, or run without --tokenizer (no lens)"
        )


def _read_tensor(path: Path, key: str, name: str) -> torch.Tensor:
    """One tensor, as float32 (its header already checked against the config)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as file:
            value: torch.Tensor = file.get_tensor(key).float()
            return value
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise TokenvizError(f"cannot read {safe_text(key)[:80]} of {name}: {_first_line(exc)}") from None


def load_head(source: str | None) -> OutputHead | None:
    """The head of the model in the directory `source`; None where there is none (no source, or a hub id:
    the served model's view says to give its directory)."""
    directory = Path(source).expanduser() if source else None
    return OutputHead(directory) if directory is not None and directory.is_dir() else None
