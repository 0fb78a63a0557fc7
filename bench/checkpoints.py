"""Checkpoints of real models' shapes that cost nothing on disk: a config and a safetensors file
whose header lists every tensor and whose data is a hole (a sparse file). What the memory check
reads of a 70B model is there; nothing else is."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import torch

SHAPES = {  # Llama 3's
    "8B": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
    "70B": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
}


def sparse_checkpoint(directory: Path, shape: dict) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=128256, num_key_value_heads=8, **shape)
    config.save_pretrained(directory)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    header, offset = {}, 0
    for name, p in model.state_dict().items():
        size = p.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(p.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(directory / "model.safetensors", "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw)
        file.truncate(8 + len(raw) + offset)


# A small parent that runs a command and reports its peak memory: the caller's other children
# (a test run's, a bench's) do not count.
_PEAK_PROBE = (
    "import json, resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(json.dumps([done.returncode, done.stderr, peak]))"
)


def run_with_peak(command: list[str], timeout: float = 300) -> tuple[int, str, int]:
    """(exit code, stderr, peak resident memory in KiB) of `command`."""
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, *command], capture_output=True, text=True, timeout=timeout)
    code, stderr, peak = json.loads(out.stdout)
    return code, stderr, peak
