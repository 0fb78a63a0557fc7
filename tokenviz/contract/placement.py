"""How a model's weights are held: where they may go and how much each device may hold
(`--device-map`, `--max-memory DEVICE=SIZE`, `--offload-dir`), and in what form (`--quantize`).
Plain and validated, free of torch, so a mistake is refused before anything heavy is imported."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.text import safe_text

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
DEVICE_NAME = re.compile(r"^(cpu|disk|mps|cuda(:\d+)?|\d+)$")  # a device a limit or a map may name


def size_bytes(text: str) -> int:
    """'20GB' (powers of 10), '8GiB' (powers of 2), '512MB', '1000' (bytes)."""
    match = _SIZE.match(text)
    if not match:
        raise SettingsError(f"{text!r} is not a size: write it as 20GB, 8GiB or 512MB")
    return int(float(match.group(1)) * UNITS[(match.group(2) or "").upper()])


def max_memory(entries: Iterable[str]) -> dict[str, int]:
    """`--max-memory` entries as {device: bytes}: 'cuda:0=20GB' (a bare GPU number means cuda:N)."""
    limits: dict[str, int] = {}
    for entry in entries:
        device, sep, size = entry.partition("=")
        device = device.strip().lower()
        if not sep or not DEVICE_NAME.match(device):
            raise SettingsError(f"--max-memory {entry!r}: write DEVICE=SIZE, as cpu=8GB or cuda:0=20GB")
        limits[f"cuda:{device}" if device.isdigit() else device] = size_bytes(size)
    return limits


QUANTIZE = ("int8", "int4")  # weight-only: torchao's int8 (any device), int4 on a CUDA GPU
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential", "cpu")  # accelerate's, and all on the CPU


@dataclass(frozen=True)
class Placement:
    """How the weights are held: placed by accelerate's device map over the devices and the disk
    (within `max_memory`, offloading to `offload_dir`) or, without a map, all on the one device;
    quantized to `quantize` as they load, or as the checkpoint has them."""

    device_map: str | None = None
    max_memory: tuple[str, ...] = ()
    offload_dir: str | None = None
    quantize: str | None = None
    # The device map as accelerate takes it (a name, or the modules its file maps), once its file is
    # read and the offload folder checked (tokenviz.system.placement_files.resolved); None before.
    mapping: str | dict[str, str | int] | None = field(default=None, compare=False, repr=False)
    # Parsed once, on creation (a mistake is refused then, before torch is imported):
    limits: dict[str, int] = field(init=False, compare=False, repr=False)  # {device: bytes}

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_memory", tuple(self.max_memory or ()))
        object.__setattr__(self, "limits", max_memory(self.max_memory))
        choice = self.device_map
        if choice is not None and choice not in DEVICE_MAPS and not choice.endswith(".json"):
            names = ", ".join(DEVICE_MAPS)
            raise SettingsError(f"--device-map must be {names} or a .json file, got {safe_text(choice)!r}")
        if self.offload_dir is not None and self.device_map is None:
            raise SettingsError("--offload-dir goes with --device-map: without a map no weight goes to the disk")
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise SettingsError(f"--quantize must be {' or '.join(QUANTIZE)}, got {safe_text(self.quantize)!r}")


DEFAULT_PLACEMENT = Placement()
