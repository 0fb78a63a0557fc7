"""Ollama's models by name (`--model ollama:NAME[:TAG]`): the GGUF Ollama already keeps, read where it
lies. Ollama's store ($OLLAMA_MODELS, or ~/.ollama/models) holds a manifest per name and tag
(manifests/HOST/NAMESPACE/NAME/TAG, JSON: its layers, each a media type and a digest) and the layers
themselves as blobs (blobs/sha256-HEX); the model's layer is the GGUF.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from tokenviz.contract.bounds import first_error
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.text import safe_text, shortened
from tokenviz.system.reading import parse_json, read_file

PREFIX = "ollama:"
REGISTRY = "registry.ollama.ai"
MODEL_LAYER = "application/vnd.ollama.image.model"
MANIFEST_BYTES = 1 << 20
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}(/[a-z0-9][a-z0-9._-]{0,127})?(:[A-Za-z0-9][A-Za-z0-9._-]{0,127})?")
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
SHOWN = 12  # names listed when the one asked is not there


def store() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_gguf(spec: str) -> Path:
    """The GGUF blob of `ollama:NAME[:TAG]` (the tag `latest` by default), or one line naming what the
    store holds."""
    name = spec.removeprefix(PREFIX)
    if not NAME.fullmatch(name):
        raise TokenvizError(f"--model {safe_text(shortened(spec, 60))}: give ollama:NAME or ollama:NAME:TAG")
    model, _, tag = name.partition(":")
    namespace, _, base = model.rpartition("/")
    root = store()
    manifest = root / "manifests" / REGISTRY / (namespace or "library") / base / (tag or "latest")
    if not (manifest.exists() or manifest.is_symlink()):
        held = names(root)
        listed = ", ".join(held[:SHOWN]) + (f" and {len(held) - SHOWN} more" if len(held) > SHOWN else "")
        raise TokenvizError(
            f"--model {spec}: Ollama's store ({safe_text(str(root))}) has no {name}"
            + (f"; it has {listed}" if held else ": it is empty")
        )
    what = f"--model {spec}: its manifest"
    document = parse_json(read_file(manifest, MANIFEST_BYTES, what, TokenvizError), what, TokenvizError)
    try:
        layers = Manifest.model_validate(document).layers
    except ValidationError as exc:
        raise TokenvizError(f"{what} is not Ollama's: {first_error(exc)}") from None
    digests = [layer.digest for layer in layers if layer.mediaType == MODEL_LAYER]
    found = DIGEST.fullmatch(digests[0]) if digests else None
    if found is None:
        raise TokenvizError(f"{what} names no model layer")
    blob = root / "blobs" / f"sha256-{found.group(1)}"
    if not (blob.exists() or blob.is_symlink()):
        raise TokenvizError(f"--model {spec}: its model layer is not in the store ({blob.name} is missing)")
    if not blob.is_file():  # a FIFO, a device, a directory: followed through a link
        raise TokenvizError(f"--model {spec}: its model layer {blob.name} is not a regular file")
    return blob


class Layer(BaseModel):
    """One layer of a manifest: what it is and where its blob lies (the rest of it is Ollama's)."""

    mediaType: str = Field(strict=True)
    digest: str = Field(strict=True, max_length=80)


class Manifest(BaseModel):
    layers: list[Layer] = Field(max_length=1024)


def names(root: Path) -> list[str]:
    """The NAME:TAG of every manifest in the store (the library's without its namespace)."""
    base = root / "manifests" / REGISTRY
    found = []
    for manifest in sorted(base.glob("*/*/*")) if base.is_dir() else ():
        namespace, model, tag = manifest.relative_to(base).parts
        shown = model if namespace == "library" else f"{namespace}/{model}"
        found.append(safe_text(f"{shown}:{tag}"))
    return found
