"""A model spread by a device map (accelerate's): over GPUs, the CPU and the disk.

transformers loads each weight straight onto the device the map gives it; accelerate's hooks move
each module's inputs (and, for the disk, its weights) to where it runs. What tokenviz adds: where the
ids go in, a line saying which layers live where, and a weight read outside a forward pass (the
lens's embedding row) fetched from wherever it lives.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.memory import gigabytes
from tokenviz.contract.errors import ModelLoadError
from tokenviz.system.paths import cache_root


def accelerate_limits(limits: dict[str, int]) -> dict[str | int, int]:
    """--max-memory as accelerate names the devices: GPUs by number."""
    return {int(d.removeprefix("cuda:")) if d.startswith("cuda:") else d: n for d, n in limits.items()}


def check_map_modules(name: str, config: Any, mapping: dict[str, str | int], trust_remote_code: bool = False) -> None:
    """Refuse a device map naming modules the model does not have (built on the meta device, so
    nothing is allocated), naming them: accelerate would place the model as if they were not there."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    known = {n for n, _ in model.named_modules()} | {n for n, _ in model.named_parameters()}
    unknown = [key for key in mapping if key and key not in known]
    if unknown:
        shown = ", ".join(repr(key[:60]) for key in unknown[:3]) + (
            f" and {len(unknown) - 3} more" if unknown[3:] else ""
        )
        example = next((n for n in sorted(known) if n.endswith(".0")), min(known, key=len))
        raise ModelLoadError(
            f"the device map names {shown}, which {name} does not have (its parts are named like {example!r})"
        )


def offload_dir_for(source: str) -> Path:
    """Where the disk's share of a model's weights goes, unless --offload-dir says: one folder per model."""
    key = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    return cache_root() / "offload" / f"{Path(source).name or 'model'}-{key}"


def input_device(model: Any) -> torch.device:
    """Where the ids go in: the input embedding's device (for one offloaded, where its hook runs it)."""
    embeddings = model.get_input_embeddings()
    runs_on = getattr(getattr(embeddings, "_hf_hook", None), "execution_device", None)
    if runs_on is not None:
        return torch.device(f"cuda:{runs_on}" if isinstance(runs_on, int) else runs_on)
    device: torch.device = embeddings.weight.device
    return device


@contextmanager
def weights_at_hand(module: torch.nn.Module) -> Iterator[None]:
    """Inside, the module's own weights are real tensors even if it lives on the disk."""
    from accelerate.utils import align_module_device

    with align_module_device(module):
        yield


def places(model: Any) -> dict[str, str]:
    """Each part of a spread model's device map and where its weights live ('cuda:0', 'cpu',
    'disk'); empty for a model in one place."""
    named = device_map_of(model)
    return named if len(set(named.values())) > 1 else {}


def device_map_of(model: Any) -> dict[str, str]:
    """Where accelerate's device map put each part of `model` ('cuda:0', 'cpu', 'disk'); empty without one."""
    mapping: dict[str, str | int] = getattr(model, "hf_device_map", None) or {}
    return {name: f"cuda:{where}" if isinstance(where, int) else str(where) for name, where in mapping.items()}


def placed(model: Any) -> str:
    """Which decoder layers (and how many other parts) live on each device or the disk, and their
    bytes, wherever a device map placed the model: in one place too (accelerate may put a whole model
    on the disk, and the line is then what says so); '' without a device map."""
    mapping = device_map_of(model)
    if not mapping:
        return ""
    if set(mapping) == {""}:  # the whole model, as one part
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        return f"{mapping['']}: the whole model ({gigabytes(size)})"
    prefix = next((name for name, module in model.named_modules() if module is decoder_layers(model)), "")
    layer = re.compile(rf"^{re.escape(prefix)}\.(\d+)$")
    where: dict[str, tuple[list[int], int, int]] = {}  # device: (layers, other parts, bytes)
    for name, key in mapping.items():
        module = model.get_submodule(name) if name else model
        size = sum(p.numel() * p.element_size() for p in module.parameters())
        layers, others, total = where.get(key, ([], 0, 0))
        number = layer.match(name)
        if number:
            layers.append(int(number.group(1)))
        elif module is decoder_layers(model):  # all of them in one place
            layers.extend(range(len(module)))
        elif size:  # a part without weights, as a rotary embedding, is not worth a word
            others += 1
        where[key] = (layers, others, total + size)
    return " · ".join(_on_device(device, *held) for device, held in where.items())


def _on_device(device: str, layers: list[int], others: int, size: int) -> str:
    """'disk: layers 1-3, 2 other parts (0.6 MB)'."""
    parts = [_layer_span(layers)] if layers else []
    if others:
        parts.append(f"{others} other part{'s' if others > 1 else ''}")
    return f"{device}: {', '.join(parts)} ({gigabytes(size)})"


def _layer_span(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> 'layers 0-2, 5'."""
    runs: list[list[int]] = []
    for n in sorted(layers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    spans = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {spans}"
