"""What a model directory's weights hold, read from their index and headers alone (no tensor is read):
the shards the index names, which must lie inside the directory, and the decoder layers the tensors'
names number, which must be as many as the config says. Either mistake is refused in one line before
transformers builds the model (a config of 20,000 layers over a three-layer checkpoint had taken a
minute and 2 GB to be refused by the weights' report).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from safetensors import safe_open

from tokenviz.backends.shared.parts import text_config
from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.reading import parse_json, read_file

INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
MAX_INDEX_BYTES = 64 << 20
LAYER_NUMBER = re.compile(r"\.(?:layers|layer|h|blocks|block)\.(\d+)\.")  # model.layers.12.mlp…, transformer.h.3.…


def check_checkpoint(directory: Path, name: str, config: Any) -> None:
    """Refuse, in one line, an index naming a shard outside `directory`, or weights that number fewer
    decoder layers than `config` has. Weights this cannot read (.bin, damaged headers) are left to
    transformers' loader, which refuses them in its own words."""
    shards = weight_files(directory, name)
    names = _tensor_names(directory, shards)
    text = text_config(config)
    layers = getattr(text, "num_hidden_layers", None)
    held = {int(m.group(1)) for key in names if (m := LAYER_NUMBER.search(key))}
    if isinstance(layers, int) and held and layers > len(held):
        raise ModelLoadError(
            f"{name}'s config has {layers:,} layers and its weights hold {len(held):,}: "
            "is it the checkpoint of this config?"
        )


def weight_files(directory: Path, name: str) -> list[str]:
    """The weight files: the index's shards (each checked to lie inside `directory`), or the
    directory's own .safetensors files."""
    for index in INDEXES:
        path = directory / index
        if not path.is_file():
            continue
        doc = parse_json(read_file(path, MAX_INDEX_BYTES, f"{name}'s {index}", ModelLoadError), index, ModelLoadError)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{name}'s {index} has no weight_map of tensor names to shard files")
        inside = directory.resolve()
        for shard in sorted(set(weight_map.values())):
            if Path(shard).is_absolute() or not (directory / shard).resolve().is_relative_to(inside):
                raise ModelLoadError(
                    f"{name}'s {index} names the shard {safe_text(shortened(shard, 80))!r}, outside the model's "
                    "directory: refused"
                )
        return sorted(set(weight_map.values())) if index.startswith("model.safetensors") else []
    return sorted(p.name for p in directory.glob("*.safetensors"))


def _tensor_names(directory: Path, shards: list[str]) -> set[str]:
    names: set[str] = set()
    for shard in shards:
        try:
            with safe_open(str(directory / shard), framework="pt") as file:
                names.update(file.keys())
        except Exception:  # unreadable or damaged: transformers' loader says so
            return set()
    return names
