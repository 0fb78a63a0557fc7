"""The files a placement names, read and checked before anything heavy is imported: the device map's
JSON file (read with bounds) and the offload folder (it must be able to hold files)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from tokenviz.contract.errors import SettingsError
from tokenviz.contract.placement import DEVICE_MAPS, DEVICE_NAME, Placement
from tokenviz.contract.text import safe_text
from tokenviz.system.paths import unwritable_folder
from tokenviz.system.reading import parse_json, read_file

MAX_MAP_BYTES = 1 << 20  # a device map file is read no further


def resolved(placement: Placement) -> Placement:
    """`placement` with its device map's `mapping` read (a name, or the module-to-device mapping its
    file holds) and its offload folder checked: a mistake is one line. A placement resolved already
    (the command line's, before torch's import) is returned as it is: the files are read once."""
    if placement.mapping is not None or placement.device_map is None:  # no map: no offload folder either
        return placement
    mapping = device_map(placement.device_map)
    if placement.offload_dir is not None:
        check_offload_dir(placement.offload_dir)
    return dataclasses.replace(placement, mapping=mapping)


def device_map(choice: str | None) -> str | dict[str, str | int] | None:
    """`--device-map`: one of DEVICE_MAPS, or a JSON file mapping module names to devices
    ({"model.layers.0": 0, "lm_head": "cpu", "model.layers.9": "disk", ...})."""
    if choice is None or choice in DEVICE_MAPS:
        return choice
    shown = safe_text(choice)
    what = f"--device-map {shown!r}"
    mapping = parse_json(read_file(choice, MAX_MAP_BYTES, what), what)
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and _a_device(v) for k, v in mapping.items()):
        raise SettingsError(f"--device-map {shown!r} must map module names to devices (0, cpu, disk)")
    return mapping


def _a_device(value: object) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and bool(DEVICE_NAME.match(value)))


def check_offload_dir(folder: str) -> None:
    """`--offload-dir` is where a device map puts the weights it sends to the disk: refused where no
    file can be written."""
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
