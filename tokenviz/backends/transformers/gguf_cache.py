"""The cache of converted GGUF files: a .gguf is dequantised once, a tensor at a time
(gguf_streaming.py), and saved as safetensors in the user's cache directory; a manifest written last
marks the conversion complete and holds a digest of the weights, so a stale, half-written or damaged
cache is rebuilt. One process converts at a time (a lock beside the cache); conversions whose GGUF is
gone, or that a killed process left half done, are pruned.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from tokenviz.backends.transformers.gguf_streaming import (
    SHARD_BYTES,
    ShardNotWritten,
    largest_tensor_bytes,
    stream_gguf,
)
from tokenviz.backends.transformers.memory import WORKING_SHARE, free_bytes, gigabytes, parameter_count
from tokenviz.backends.transformers.quiet import one_line, quiet
from tokenviz.contract.errors import ModelLoadError
from tokenviz.system.paths import cache_root

MANIFEST = "tokenviz-manifest.json"
MANIFEST_VERSION = 3
DIGEST_BLOCKS = 64  # blocks of the weights file hashed for the manifest's digest
DIGEST_BLOCK_BYTES = 1 << 16
SAVE_SHARE = 0.9  # of the conversion's bar, the tensors' share; saving them takes the rest

Progress = Callable[[str, "float | None"], None]  # (message, fraction done or None)


def _fingerprint(gguf: Path) -> dict[str, Any]:
    import transformers

    stat = gguf.stat()
    return {
        "version": MANIFEST_VERSION,
        "source": str(gguf.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def gguf_cache_dir(gguf: Path) -> Path:
    key = hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def weights_digest(path: Path) -> str:
    """The file's size and a hash of DIGEST_BLOCKS blocks spread evenly through it: cheap to check
    at every start (4 MB read), and any damage wider than the gaps between blocks changes it."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    step = max(size // DIGEST_BLOCKS, DIGEST_BLOCK_BYTES)
    with path.open("rb") as file:
        for offset in range(0, size, step):
            file.seek(offset)
            digest.update(file.read(DIGEST_BLOCK_BYTES))
    return f"{size}:{digest.hexdigest()[:32]}"


def weights_digests(directory: Path) -> dict[str, str]:
    """Each weights file's digest, by name."""
    return {path.name: weights_digest(path) for path in sorted(directory.glob("*.safetensors"))}


def write_manifest(directory: Path, gguf: Path) -> None:
    manifest = {**_fingerprint(gguf), "weights": weights_digests(directory)}
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _cache_is_fresh(directory: Path, gguf: Path) -> bool:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        digest = manifest.pop("weights")
        return manifest == _fingerprint(gguf) and bool(digest) and digest == weights_digests(directory)
    except (OSError, ValueError, KeyError, AttributeError):
        return False


class CacheNotWritable(ModelLoadError):
    """The model cache cannot be written; the reason is the message (where nothing else can be
    done, as when a damaged cache cannot be rebuilt, it reaches the user as it is)."""


def ensure_converted(gguf: Path, directory: Path, progress: Progress, rebuild: bool = False) -> None:
    """Convert `gguf` into `directory` unless a fresh conversion is there. One process converts at
    a time (a lock file beside the cache); the others wait and then find it done."""
    if _cache_is_fresh(directory, gguf) and not rebuild:
        return
    lock_path = directory.with_name(directory.name + ".lock")
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lock_path))
        lock.acquire()
    except OSError as exc:
        raise CacheNotWritable(f"the model cache in {lock_path.parent} cannot be written ({exc.strerror})") from None
    try:
        if rebuild or not _cache_is_fresh(directory, gguf):  # another process may have converted it
            with quiet():
                convert_gguf(gguf, directory, progress)
    except BaseException:
        # (a conversion that failed leaves no lock file behind: removed while still held, so a process
        # waiting on it converts after, as it would have; the next one makes a new file)
        lock_path.unlink(missing_ok=True)
        raise
    finally:
        lock.release()


def convert_gguf(gguf: Path, directory: Path, progress: Progress) -> None:
    """Dequantise a .gguf into safetensors under `directory` (the slow, one-time path), a tensor at a
    time: a GGUF whose float32 form fits on the disk converts, whatever the memory."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    message = f"converting {gguf.name} to safetensors once; later starts skip this"
    progress(f"{message}: reading its tokenizer and metadata", None)  # no fraction yet: the bar pulses
    shutil.rmtree(directory, ignore_errors=True)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True, exist_ok=True)
        with _removed_on_failure(partial):
            try:
                with gguf_read_once():
                    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                    _check_conversion_fits(gguf, config, directory)
                    architecture = stream_gguf(gguf, partial, config, lambda f: progress(message, SAVE_SHARE * f))
            except (ModelLoadError, ShardNotWritten):  # CacheNotWritable is a ModelLoadError
                raise
            except Exception as exc:  # the gguf reader raises many types for a damaged file
                raise ModelLoadError(f"could not read GGUF file {gguf}: {one_line(exc)}") from None
            progress(f"{message}: saving", SAVE_SHARE)
            if hasattr(config, "quantization_config"):  # the weights are plain floats now
                del config.quantization_config
            config.dtype, config.architectures = torch.float32, [architecture]
            config.save_pretrained(partial)
            GenerationConfig.from_model_config(config).save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            write_manifest(partial, gguf)
            partial.rename(directory)
    except OSError as exc:  # a full disk, a cache made read-only meanwhile
        raise CacheNotWritable(f"the model cache in {directory.parent} could not be written ({exc.strerror})") from None
    prune_orphaned_caches()
    progress("conversion done", 1.0)


@contextlib.contextmanager
def _removed_on_failure(partial: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _check_conversion_fits(gguf: Path, config: Any, directory: Path) -> None:
    """The conversion saves the whole model in float32 on disk, and holds a shard and a tensor in
    memory: refuse a GGUF too large for either before it starts (a 4 GB Q4 file of a 7B model
    becomes 28 GB on disk). Loading it afterwards is checked like any model directory."""
    size = parameter_count(config).total * torch.float32.itemsize
    held = min(size, SHARD_BYTES) + 2 * largest_tensor_bytes(gguf)  # dequantised, then copied
    memory = free_bytes(torch.device("cpu"), {})[0]
    directory.parent.mkdir(parents=True, exist_ok=True)
    disk = shutil.disk_usage(directory.parent).free
    if held * (1 + WORKING_SHARE) > memory:
        raise ModelLoadError(
            f"converting {gguf.name} dequantises it to {gigabytes(size)} of float32 weights on disk, holding "
            f"{gigabytes(held)} in memory, and there are {gigabytes(memory)} of memory free: a GGUF this large "
            "cannot be opened here"
        )
    if size > disk:  # as a cache that cannot be written: the GGUF is read in memory instead, if that fits
        raise CacheNotWritable(
            f"the model cache in {directory.parent} has {gigabytes(disk)} free, and {gguf.name} takes "
            f"{gigabytes(size)} as float32 safetensors"
        )


def prune_orphaned_caches() -> list[Path]:
    """Remove converted models whose .gguf no longer exists, and conversions a killed process left
    half done (a `.partial` whose lock no process holds). The cache is keyed by the file's path, so
    each deleted virtual environment would otherwise leave its conversion (0.5 GB) behind."""
    removed = []
    for directory in sorted((cache_root() / "models").glob("*")):
        if directory.suffix == ".partial":
            if _unlocked(directory.with_suffix(".lock")):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
            continue
        try:
            source = json.loads((directory / MANIFEST).read_text())["source"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a finished conversion of ours: leave it
        if isinstance(source, str) and not Path(source).exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _unlocked(lock_path: Path) -> bool:
    """Whether no process is converting under `lock_path` now."""
    try:
        with FileLock(str(lock_path), timeout=0):
            return True
    except (OSError, TimeoutError):  # filelock's Timeout is a TimeoutError
        return False


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """transformers reads the GGUF's metadata three times (tokenizer, config, weights: about 5 s each
    for the bundled model) and rebuilds gguf's tensor-name map once per module (397 times). For the
    length of one conversion, each is built once and shared."""
    import copy

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    originals = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint)
    readers: dict[str, object] = {}
    metadata: dict[str, dict[str, Any]] = {}

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return originals[0](path, *args, **kwargs)
        if str(path) not in readers:
            readers[str(path)] = originals[0](path)
        return readers[str(path)]

    def checkpoint(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return originals[2](path, return_tensors=return_tensors, **kwargs)  # type: ignore[no-untyped-call]
        if str(path) not in metadata:
            metadata[str(path)] = originals[2](path, return_tensors=False)  # type: ignore[no-untyped-call]
        return copy.deepcopy(metadata[str(path)])  # callers change what they get

    gguf.GGUFReader = reader  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(originals[1])
    gguf_utils.load_gguf_checkpoint = checkpoint  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = originals  # type: ignore[misc]
