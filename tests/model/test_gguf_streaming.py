"""A GGUF is dequantised into safetensors a tensor at a time: the weights are transformers' own, and
the conversion never holds the whole float32 model (which had kept a 7B Q4 GGUF from opening on a
machine with less memory than its 28 GB of float32)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from tokenviz.backends.transformers import gguf_cache
from tokenviz.system.paths import bundled_gguf

SHARD = 16 << 20  # small shards: the bundled model's 0.5 GB of float32 becomes dozens

# The conversion in a process of its own, measured from the resident memory just before it. The peak
# is the kernel's high-water mark of this process's own memory (VmHWM): getrusage's ru_maxrss would
# start from the test run's peak, which a child spawned by vfork inherits.
CONVERT = f"""
import json
from pathlib import Path
from tokenviz.backends.transformers import gguf_cache, gguf_streaming, loading  # (loading: what the app imports first)
from tokenviz.system.paths import bundled_gguf
def status_mb(field):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
    return int(line.split()[1]) / 1024
gguf_streaming.SHARD_BYTES = {SHARD}
before = status_mb("VmRSS:")
gguf_cache.ensure_converted(bundled_gguf(), gguf_cache.gguf_cache_dir(bundled_gguf()), lambda message, fraction: None)
print(json.dumps({{"grew_mb": status_mb("VmHWM:") - before}}))
"""


@pytest.mark.bundled
def test_a_gguf_converts_a_tensor_at_a_time_into_transformers_own_weights(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", CONVERT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    grew_mb = json.loads(out.stdout.strip().splitlines()[-1])["grew_mb"]

    gguf = bundled_gguf()
    directory = tmp_path / "tokenviz" / "models" / gguf_cache.gguf_cache_dir(gguf).name
    mine = {}
    for shard in directory.glob("*.safetensors"):
        mine.update(load_file(shard))
    with gguf_cache.gguf_read_once():
        own = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).state_dict()
    # The same weights, bit for bit (the output layer is tied to the embedding, as the GGUF has it).
    assert set(mine) == set(own) - {"lm_head.weight"}
    assert all(torch.equal(mine[name], own[name]) for name in mine)
    # The whole conversion (the GGUF's metadata and tokenizer read, a shard, the tensor being
    # dequantised, the file's pages) held less than the float32 model: 0.44 of its 0.51 GB here, where
    # transformers' own loader grows by 0.8 GB.
    assert grew_mb < sum(t.nbytes for t in mine.values()) / 2**20

    shards = sorted(directory.glob("model-*-of-*.safetensors"))
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(shards) > 10 and set(index["weight_map"].values()) == {s.name for s in shards}
    # Every shard is in the manifest's digest: damage to any one of them is found.
    assert gguf_cache._cache_is_fresh(directory, bundled_gguf())
    middle = shards[len(shards) // 2]
    damaged = bytearray(middle.read_bytes())
    damaged[len(damaged) // 2 : len(damaged) // 2 + 4096] = bytes(4096)
    middle.unlink()  # (replace, never overwrite in place)
    middle.write_bytes(bytes(damaged))
    assert not gguf_cache._cache_is_fresh(directory, bundled_gguf())


@pytest.mark.bundled
def test_a_full_disk_while_converting_is_the_caches_failure_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    from tokenviz.backends.transformers import gguf_streaming

    def full(*args, **kwargs):
        raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28) at "x"')

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(gguf_streaming, "SHARD_BYTES", 1 << 20)  # (the first shard fills at once)
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    directory = gguf_cache.gguf_cache_dir(bundled_gguf())
    with pytest.raises(gguf_cache.CacheNotWritable, match=r"could not be written .*No space left on device"):
        gguf_cache.convert_gguf(bundled_gguf(), directory, lambda message, fraction: None)
    assert list(directory.parent.iterdir()) == []  # no conversion, no half of one
