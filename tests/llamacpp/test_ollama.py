"""Ollama's models by name (`--model ollama:NAME[:TAG]`): the GGUF Ollama keeps, opened where it lies, from
a store laid out here as Ollama lays it out (manifests by name and tag, blobs by digest)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from clitools import invoke

from tokenviz.system.paths import bundled_gguf

pytestmark = pytest.mark.llamacpp


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An Ollama store holding the bundled GGUF as smollm2:latest (its blob a link to the file)."""
    gguf = bundled_gguf()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (tmp_path / "blobs").mkdir()
    os.symlink(gguf, tmp_path / "blobs" / f"sha256-{digest}")
    manifest = tmp_path / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "latest"
    manifest.parent.mkdir(parents=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": gguf.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    return tmp_path


def test_an_ollama_name_opens_the_gguf_ollama_keeps(store, llama_cpp, monkeypatch, capsys):
    args = ["trace", "The Eiffel Tower is located in", "--backend", "llama.cpp", "--threads", "2"]
    code, out, err = invoke(
        monkeypatch, capsys, *args, "--model", "ollama:smollm2", "--steps", "3", "-t", "0", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["model"]["name"] == "ollama:smollm2" and doc["text"] == " the Champ de"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("ollama:llama3", "has no llama3; it has smollm2:latest"),
        ("ollama:smollm2:q8", "has no smollm2:q8; it has smollm2:latest"),
        ("ollama:../etc", "give ollama:NAME or ollama:NAME:TAG"),
    ],
)
def test_a_name_the_store_lacks_is_one_line_naming_what_it_holds(store, monkeypatch, capsys, name, said):
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--model", name)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


def test_an_ollama_name_without_the_llama_cpp_backend_says_to_add_it(store, monkeypatch, capsys):
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--model", "ollama:smollm2")
    assert code == 2 and "an Ollama name goes with the --backend that runs Ollama's GGUFs" in err, err


def manifest_of(store, tag: str = "latest"):
    return store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / tag


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ('{"layers": 5}', "its manifest is not Ollama's: at layers: Input should be a valid list"),
        ("true", "its manifest is not Ollama's: at the top level"),
        ("1.5", "its manifest is not Ollama's: at the top level"),
        ('{"layers": [{"mediaType": 3, "digest": "x"}]}', "its manifest is not Ollama's: at layers.0.mediaType"),
        ('{"layers": []}', "its manifest names no model layer"),
    ],
)
def test_a_manifest_of_another_shape_is_one_line(store, monkeypatch, capsys, document, said):
    """{"layers": 5} was TypeError: 'int' object is not iterable."""
    manifest_of(store).write_text(document)
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--model", "ollama:smollm2")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_manifest_that_is_not_a_file_is_named_as_such(store, monkeypatch, capsys, kind):
    """Called "has no fifoman; it has … fifoman:latest" before."""
    manifest = manifest_of(store, "odd")
    os.mkfifo(manifest) if kind == "fifo" else manifest.mkdir()
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--model", "ollama:smollm2:odd")
    said = "is a directory" if kind == "directory" else "is not a regular file"
    assert code == 2 and f"--model ollama:smollm2:odd: its manifest {said}" in err and "has no" not in err, err


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_a_blob_that_is_not_a_file_is_named_as_such_not_missing(store, monkeypatch, capsys, kind):
    blob = next((store / "blobs").iterdir())
    blob.unlink()
    os.symlink("/dev/zero", blob) if kind == "dev-zero" else os.mkfifo(blob)
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--model", "ollama:smollm2")
    assert code == 2 and f"its model layer {blob.name} is not a regular file" in err and "missing" not in err, err
