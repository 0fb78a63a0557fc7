"""A served model's own final norm, output head and input embeddings, read here from its files alone.

The lens reads a layer's residual stream as the model reads its last: through the final norm and the
unembedding. The server does not send those, so they come from the model's directory (--tokenizer DIR):
its config builds the model with no weights (accelerate's empty weights), and only the tensors of those
modules are read from its safetensors, never the rest. The modules are the model's own (transformers'
code for its family: Gemma's 1 + weight norm, soft-capping, logit scales), so the lens is the local
lens's computation (backends.transformers.lens) on the server's residuals.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tokenviz.backends.transformers.checkpoint import weight_files
from tokenviz.backends.transformers.lens import final_norm, head_logits, stream_merge, submodule
from tokenviz.backends.transformers.parts import text_config
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text


class OutputHead:
    """The model's final norm, output head and input embeddings (float32, on the CPU)."""

    def __init__(self, directory: Path):
        from accelerate import init_empty_weights
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM

        name = safe_text(str(directory))
        try:
            config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
            with init_empty_weights():  # parameters on the meta device: nothing allocated, nothing read
                model = AutoModelForCausalLM.from_config(config)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TokenvizError(
                f"the lens cannot build {name}'s model from its config: {safe_text(said)[:160]}"
            ) from None
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
            with safe_open(str(directory / found[stored]), framework="pt") as file:
                value = file.get_tensor(stored).float()
            setattr(module, attribute, torch.nn.Parameter(value, requires_grad=False))
        for module in modules.values():
            for buffer_name, buffer in module.named_buffers(recurse=True):  # (real: empty weights keep buffers)
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


def _located(directory: Path, name: str) -> dict[str, str]:
    """Each tensor's name in the directory's safetensors, to its file (read from their headers alone)."""
    from safetensors import safe_open

    shards = weight_files(directory, name)  # (each checked to lie inside the directory)
    if not shards:
        raise TokenvizError(f"the lens needs {name}'s weights as safetensors, and it has none")
    located: dict[str, str] = {}
    for shard in shards:
        with safe_open(str(directory / shard), framework="pt") as file:
            located.update(dict.fromkeys(file.keys(), shard))
    return located


def load_head(source: str | None) -> OutputHead | None:
    """The head of the model in the directory `source`; None where there is none (no source, or a hub id:
    the served model's view says to give its directory)."""
    directory = Path(source).expanduser() if source else None
    return OutputHead(directory) if directory is not None and directory.is_dir() else None
