"""How a model's weights are held: where they may go and how much each device may hold
(`--device-map`, `--max-memory DEVICE=SIZE`, `--offload-dir`), and in what form (`--quantize`).
Plain and validated, free of torch, so a mistake is refused before anything heavy is imported."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.paths import unwritable_folder
from tokenviz.contract.reading import parse_json, read_file
from tokenviz.contract.text import safe_text

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
_DEVICE = re.compile(r"^(cpu|disk|mps|cuda(:\d+)?|\d+)$")
MAX_MAP_BYTES = 1 << 20  # a device map file is read no further


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
        if not sep or not _DEVICE.match(device):
            raise SettingsError(f"--max-memory {entry!r}: write DEVICE=SIZE, as cpu=8GB or cuda:0=20GB")
        limits[f"cuda:{device}" if device.isdigit() else device] = size_bytes(size)
    return limits


QUANTIZE = ("int8", "int4")  # weight-only: torchao's int8 (any device), int4 on a CUDA GPU
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential", "cpu")  # accelerate's, and all on the CPU


def device_map(choice: str | None) -> str | dict[str, str | int] | None:
    """`--device-map`: one of DEVICE_MAPS, or a JSON file mapping module names to devices
    ({"model.layers.0": 0, "lm_head": "cpu", "model.layers.9": "disk", ...})."""
    if choice is None or choice in DEVICE_MAPS:
        return choice
    if not choice.endswith(".json"):
        raise SettingsError(f"--device-map must be {', '.join(DEVICE_MAPS)} or a .json file, got {safe_text(choice)!r}")
    shown = safe_text(choice)
    what = f"--device-map {shown!r}"
    mapping = parse_json(read_file(choice, MAX_MAP_BYTES, what), what)
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and _a_device(v) for k, v in mapping.items()):
        raise SettingsError(f"--device-map {shown!r} must map module names to devices (0, cpu, disk)")
    return mapping


def _a_device(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and bool(_DEVICE.match(value)))


def check_offload_dir(folder: str, mapping: str | None) -> None:
    """`--offload-dir` is where a device map puts the weights it sends to the disk: refused without a
    map (nothing would go there) and where no file can be written."""
    if mapping is None:
        raise SettingsError("--offload-dir goes with --device-map: without a map no weight goes to the disk")
    path = Path(folder).expanduser()
    shown = safe_text(folder)
    if not path.exists():
        problem = unwritable_folder(path.parent)
        if problem:
            raise SettingsError(f"--offload-dir {shown!r} cannot be made: {safe_text(problem)}")
        return
    if not path.is_dir():
        raise SettingsError(f"--offload-dir {shown!r} is not a directory")
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise SettingsError(f"--offload-dir {shown!r} cannot hold files: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class Placement:
    """How the weights are held: placed by accelerate's device map over the devices and the disk
    (within `max_memory`, offloading to `offload_dir`) or, without a map, all on the one device;
    quantized to `quantize` as they load, or as the checkpoint has them."""

    device_map: str | None = None
    max_memory: tuple[str, ...] = ()
    offload_dir: str | None = None
    quantize: str | None = None
    # Parsed once, on creation (a mistake is refused then, before torch is imported):
    limits: dict[str, int] = field(init=False, compare=False, repr=False)  # {device: bytes}
    mapping: str | dict[str, str | int] | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_memory", tuple(self.max_memory or ()))
        object.__setattr__(self, "mapping", device_map(self.device_map))
        object.__setattr__(self, "limits", max_memory(self.max_memory))
        if self.offload_dir is not None:
            check_offload_dir(self.offload_dir, self.device_map)
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise SettingsError(f"--quantize must be {' or '.join(QUANTIZE)}, got {safe_text(self.quantize)!r}")


DEFAULT_PLACEMENT = Placement()
