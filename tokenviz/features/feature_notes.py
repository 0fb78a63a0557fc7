"""What is known of an SAE's features beyond its weights, kept in files beside it in its folder:

- `tokenviz-index.json`, written by `tokenviz sae-index DIR --text FILE`: each feature's top-activating
  contexts over a text of the user's (the model's residual after the SAE's layer, the SAE's encode);
- `neuronpedia.json`, where the user puts one: Neuronpedia's export of a release's explanations (a list of
  objects, each with the feature's `index` and its `description`), read as they give it.

Both are read as untrusted input (bounded, their values of their kinds, their text made safe), once a
folder while it is unchanged; a file that is not what it says is one line.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenviz.contract.errors import ModelLoadError
from tokenviz.contract.text import is_count, safe_text, shortened
from tokenviz.features.sparse_autoencoder import SparseAutoencoder
from tokenviz.files.atomic import write_file
from tokenviz.system.reading import parse_json, read_file

INDEX_FILE = "tokenviz-index.json"
INDEX_FORMAT = "tokenviz-sae-index/1"
NEURONPEDIA_FILE = "neuronpedia.json"
NOTES_BYTES = 512 << 20  # a notes file past this is not one (Neuronpedia's of a 1M-feature release fits)
CONTEXTS = 5  # a feature's top-activating contexts kept
BEFORE, AFTER = 10, 3  # tokens of a context around the one it activates on
DESCRIPTION_CHARS = 120
CONTEXT_CHARS = 160


@dataclass(frozen=True)
class FeatureNotes:
    descriptions: dict[int, str]  # Neuronpedia's, by feature
    contexts: dict[int, tuple[str, ...]]  # sae-index's, strongest first, by feature


NO_NOTES = FeatureNotes({}, {})
_READ: dict[tuple[str, int, int], FeatureNotes] = {}
_READING = threading.Lock()


def notes_of(sae: SparseAutoencoder) -> FeatureNotes:
    """The notes beside `sae` in its folder (NO_NOTES where there are none)."""
    if not sae.folder:  # made here, not read from a folder
        return NO_NOTES
    folder = Path(sae.folder)
    stamps = [_stamp(folder / name) for name in (INDEX_FILE, NEURONPEDIA_FILE)]
    if not any(stamps):
        return NO_NOTES
    key = (str(folder), stamps[0], stamps[1])
    with _READING:
        if key not in _READ:
            _READ[key] = FeatureNotes(_descriptions(folder, sae), _contexts(folder, sae))
        return _READ[key]


def _stamp(path: Path) -> int:
    """When the file at `path` last changed (0: there is none)."""
    try:
        return path.stat().st_mtime_ns if path.is_file() else 0
    except OSError:
        return 0


def _read(path: Path, what: str) -> Any:
    return parse_json(read_file(path, NOTES_BYTES, what, ModelLoadError), what, ModelLoadError, finite=True)


def _descriptions(folder: Path, sae: SparseAutoencoder) -> dict[int, str]:
    path = folder / NEURONPEDIA_FILE
    if not path.is_file():
        return {}
    what = f"{sae.name}'s {NEURONPEDIA_FILE}"
    entries = _read(path, what)
    if not isinstance(entries, list):
        raise ModelLoadError(f"{what} is not Neuronpedia's export of explanations (a list of them)")
    found: dict[int, str] = {}
    for entry in entries:
        index = entry.get("index") if isinstance(entry, dict) else None
        index = index if type(index) is int else int(index) if isinstance(index, str) and is_count(index) else None
        description = entry.get("description") if isinstance(entry, dict) else None
        if index is not None and 0 <= index < sae.d_sae and isinstance(description, str) and index not in found:
            found[index] = safe_text(shortened(" ".join(description.split()), DESCRIPTION_CHARS))
    return found


def _contexts(folder: Path, sae: SparseAutoencoder) -> dict[int, tuple[str, ...]]:
    path = folder / INDEX_FILE
    if not path.is_file():
        return {}
    what = f"{sae.name}'s {INDEX_FILE}"
    index = _read(path, what)
    features = index.get("features") if isinstance(index, dict) else None
    if not isinstance(features, dict) or index.get("format") != INDEX_FORMAT:
        raise ModelLoadError(f"{what} is not an index tokenviz sae-index wrote ({INDEX_FORMAT})")
    found: dict[int, tuple[str, ...]] = {}
    for key, entries in features.items():
        if not (is_count(key) and int(key) < sae.d_sae and isinstance(entries, list)):
            continue
        texts = [e.get("context") for e in entries[:CONTEXTS] if isinstance(e, dict)]
        found[int(key)] = tuple(safe_text(shortened(t, CONTEXT_CHARS)) for t in texts if isinstance(t, str))
    return found


def index_features(
    sae: SparseAutoencoder,
    residuals: Sequence[torch.Tensor],
    windows: Sequence[Sequence[int]],
    piece: Callable[[int], str],
) -> dict[str, list[dict[str, Any]]]:
    """Each feature's top-activating contexts: `residuals[w]` the residual at every position of window
    `windows[w]` but its first (the attention sink's), encoded; a context the tokens around the position,
    the one it activates on in «»."""
    acts = torch.cat([sae.encode(r) for r in residuals])  # (positions, d_sae)
    where = [(w, p) for w, r in enumerate(residuals) for p in range(1, 1 + len(r))]
    count = min(CONTEXTS, len(where))
    values, rows = acts.topk(count, dim=0)  # (count, d_sae): each feature's strongest positions
    found: dict[str, list[dict[str, Any]]] = {}
    for feature in range(sae.d_sae):
        entries = []
        for value, row in zip(values[:, feature].tolist(), rows[:, feature].tolist()):
            if value <= 0:
                break
            w, p = where[row]
            ids = windows[w]
            text = "".join(piece(t) for t in ids[max(0, p - BEFORE) : p]) + "«" + piece(ids[p]) + "»"
            text += "".join(piece(t) for t in ids[p + 1 : p + 1 + AFTER])
            entries.append({"activation": value, "context": text})
        if entries:
            found[str(feature)] = entries
    return found


def write_index(sae: SparseAutoencoder, features: dict[str, list[dict[str, Any]]], text: str, tokens: int) -> Path:
    """The index, written beside the SAE (its own folder; atomically, over an older one)."""
    document = {"format": INDEX_FORMAT, "sae": sae.name, "layer": sae.layer, "text": text, "tokens": tokens}
    return write_file(Path(sae.folder) / INDEX_FILE, json.dumps({**document, "features": features}), replace=True)
