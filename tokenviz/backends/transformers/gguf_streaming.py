"""Dequantise a GGUF into safetensors one tensor at a time.

transformers' GGUF loader, for Llama and most other architectures, dequantises every tensor into one
dictionary before it builds the model: converting a 4 GB Q4 file of a 7B model held 28 GB of float32,
about twice over, so tokenviz refused any GGUF whose float32 form did not fit in memory. This writes
each tensor to a shard on disk as soon as it is dequantised, using transformers' own pieces for
everything that depends on the architecture: its map from GGUF names to the model's
(`get_gguf_hf_weights_map`) and its processors that undo llama.cpp's reshaping. Memory stays at about
one shard. The model is then loaded from the shards like any model directory, so the memory check
chooses its dtype and device map.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHARD_BYTES = 1 << 30  # float32 bytes a shard holds before the next one is started
SINGLE_FILE = "model.safetensors"  # the name of the only shard, as transformers names it
INDEX = "model.safetensors.index.json"


def largest_tensor_bytes(gguf: Path) -> int:
    """The float32 size of the GGUF's largest tensor: with one shard, what converting holds at once."""
    from gguf import GGUFReader

    return max(int(t.n_elements) for t in GGUFReader(gguf).tensors) * torch.float32.itemsize


def stream_gguf(gguf: Path, directory: Path, config: Any, progress: Callable[[float], None]) -> str:
    """Write the GGUF's weights, dequantised to float32 under the names `config`'s model gives them,
    as safetensors shards in `directory` (with an index when there are several). Returns the model's
    class name."""
    from gguf import GGUFReader, dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
        read_field,
    )

    reader = GGUFReader(gguf)
    architecture = read_field(reader, "general.architecture")[0]
    metadata = load_gguf_checkpoint(str(gguf))["config"]  # what the processors read: head counts
    processor_class: Any = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
    processor = processor_class(config=metadata)
    with torch.device("meta"):  # the model's names, with no weights made
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton, processor)
    # A processor that assembles one weight from several tensors (an MoE's experts) writes it here
    # itself; those are written last.
    assembled: dict[str, torch.Tensor] = {}
    shards = _ShardWriter(directory)
    progress(0.0)
    for done, tensor in enumerate(reader.tensors, 1):
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(
            weights=weights,
            name=tensor.name,
            tensor_key_mapping=names,
            parsed_parameters={"tensors": assembled},
        )
        if result.name in names:
            shards.add(names[result.name], torch.from_numpy(_own_float32(result.weights)))
        progress(done / len(reader.tensors))
    for name, whole in assembled.items():
        shards.add(name, whole.float())
    shards.close()
    return type(skeleton).__name__


def _own_float32(array: np.ndarray) -> np.ndarray:
    """`array` as float32 that torch may own: copied only when it is not already (a float32 tensor is
    a read-only view of the file; a dequantised one is new, and copying it would hold it twice)."""
    array = np.asarray(array, dtype=np.float32)
    if not (array.flags.writeable and array.flags.c_contiguous):
        array = array.copy()
    return array


class ShardNotWritten(OSError):
    """A shard could not be saved (a full disk, a cache made read-only meanwhile): the cache's
    failure, where every other error while converting is the GGUF's."""


class _ShardWriter:
    """Tensors gathered into shards of about SHARD_BYTES, each saved as it fills."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self.pending and self.pending_bytes + tensor.nbytes > SHARD_BYTES:
            self._save()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += tensor.nbytes
        self.total += tensor.nbytes

    def _save(self) -> None:
        from safetensors.torch import save_file

        path = self.directory / f"shard-{len(self.files):05d}.safetensors"
        with _written():
            save_file(self.pending, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        """Save the last shard and name them as transformers does: one file alone, or each
        `model-0000i-of-0000n` with an index."""
        if self.pending or not self.files:
            self._save()
        with _written():
            if len(self.files) == 1:
                self.files[0][0].rename(self.directory / SINGLE_FILE)
                return
            weight_map = {}
            for i, (path, names) in enumerate(self.files, 1):
                final = f"model-{i:05d}-of-{len(self.files):05d}.safetensors"
                path.rename(self.directory / final)
                weight_map.update(dict.fromkeys(names, final))
            index = {"metadata": {"total_size": self.total}, "weight_map": weight_map}
            (self.directory / INDEX).write_text(json.dumps(index, indent=2))


@contextlib.contextmanager
def _written() -> Iterator[None]:
    """A failed write raised as ShardNotWritten (safetensors raises its own error type for one)."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise ShardNotWritten(None, reason) from exc
