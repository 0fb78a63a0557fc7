"""A GGUF whose header lies is one line and exit 2 within seconds and a little memory, before llama.cpp is
handed the file (files.gguf_header): a tensor count of a billion, data past the end, a vocabulary of a
billion, a string of 4 GB, a type llama.cpp does not know, a version it does not read."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tokenviz.files.gguf_header import read_gguf_header
from tokenviz.system.paths import bundled_gguf

LIMIT_BYTES = 1 << 30  # the address space the command may take
WITHIN_S = 10


def gguf(metadata: list[bytes], tensors: list[bytes] = (), version: int = 3, counts: tuple[int, int] | None = None):
    tensor_count, metadata_count = counts or (len(tensors), len(metadata))
    return b"GGUF" + struct.pack("<IQQ", version, tensor_count, metadata_count) + b"".join(metadata) + b"".join(tensors)


def text(value: bytes, claimed: int | None = None) -> bytes:
    return struct.pack("<Q", len(value) if claimed is None else claimed) + value


def entry(key: bytes, kind: int, value: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + value


ARCH = entry(b"general.architecture", 8, text(b"llama"))


def tensor(name: bytes, shape: tuple[int, ...], kind: int, offset: int) -> bytes:
    return (
        text(name)
        + struct.pack("<I", len(shape))
        + struct.pack(f"<{len(shape)}Q", *shape)
        + struct.pack("<IQ", kind, offset)
    )


LIES = {
    "a billion tensors": (gguf([ARCH], counts=(10**9, 1)), "claims 1,000,000,000 tensors"),
    "data past the end": (gguf([ARCH], [tensor(b"w", (4096, 4096), 0, 0)]), "bytes of data; the file holds"),
    "a vocabulary of a billion": (
        gguf([ARCH, entry(b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 10**9))]),
        "claims 1,000,000,000 entries",
    ),
    "a string of 4 GB": (gguf([entry(b"general.name", 8, text(b"x", 4 << 30))]), "claims 4,294,967,296 bytes"),
    "an unknown tensor type": (gguf([ARCH], [tensor(b"w", (32,), 999, 0)]) + bytes(64), "unknown type 999"),
    "version 9": (gguf([ARCH], version=9), "version 9 (llama.cpp reads 2 and 3)"),
    "a metadata array of arrays": (gguf([entry(b"x", 9, struct.pack("<IQ", 9, 1))]), "an array of type 9"),
}


def test_the_bundled_gguf_header_holds_its_tensors_to_the_last_byte():
    header = read_gguf_header(bundled_gguf())
    assert header.version == 3 and header.tensors > 200
    assert header.data_start + header.data_bytes == bundled_gguf().stat().st_size


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_gguf_header_that_lies_is_one_line_and_exit_2_in_seconds_and_little_memory(tmp_path, lie):
    data, said = LIES[lie]
    path = tmp_path / "model.gguf"
    path.write_bytes(data)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    command = [sys.executable, "-m", "tokenviz", "trace", "x", "--backend", "llama.cpp", "--model", str(path)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=limited)
    elapsed = time.monotonic() - started
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and said in errors[0], done.stderr
    assert "Traceback" not in done.stderr and elapsed < WITHIN_S, elapsed


def test_a_truncated_copy_of_the_bundled_gguf_is_one_line(tmp_path):
    data = Path(bundled_gguf()).read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception, match="claim 96,576,768 bytes of data; the file holds"):
        read_gguf_header(path)


def test_a_gguf_that_does_not_fit_with_its_cache_is_one_line_before_it_loads(monkeypatch, capsys):
    from types import SimpleNamespace

    import psutil
    from clitools import invoke

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=120 << 20))
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--context", "8192")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    # (30 layers × 3 KV heads × 64 × 2 × 2 bytes a token: 23,040 bytes, 180 MB at 8,192 tokens)
    assert "its KV cache at 8,192 tokens 0.2 GB); 0.1 GB is available: a smaller --context" in errors[0], err


def test_a_ggufs_chat_template_is_rendered_within_bounds():
    """The llama.cpp engine renders the GGUF's template through the bounded renderer
    (tests/model/test_chat_template_bounds.py holds the hostile templates): one that runs on is one line."""
    from tokenviz.backends.llamacpp import engine
    from tokenviz.contract.errors import TokenvizError

    fake = type("E", (), {"chat_template": "{{ 'x' * 2000000000 }}", "name": "m.gguf", "_named_token": lambda s, w: ""})
    with pytest.raises(TokenvizError, match=r"^the chat template makes a value of over"):
        engine.LlamaCppEngine.chat_ids(fake(), "hi")


MUTANTS = Path(__file__).with_name("mutations_in_one_process.py")


@pytest.mark.hostile
@pytest.mark.llamacpp
def test_no_gguf_made_from_the_bundled_one_with_one_thing_changed_brings_the_process_down(tmp_path, llama_cpp):
    """Each hyperparameter llama.cpp reads set to 0, negative, NaN or huge (or added, or of another type),
    each tensor retyped (gguf_mutations.MUTATIONS): the header's check refuses it in one line, or
    `tokenviz trace` runs it to a normal end or one line and exit 2 (in one child process, one after
    another: a mutation that aborts it is the last one it tried)."""
    from gguf_mutations import MUTATIONS, write_mutation

    from tokenviz.contract.errors import TokenvizError

    assert len(MUTATIONS) >= 40
    path, run_in_llama_cpp, refused = tmp_path / "mutated.gguf", [], {}
    for mutation in MUTATIONS:
        write_mutation(mutation, path)
        try:
            read_gguf_header(path)
        except TokenvizError as exc:
            refused[mutation.name] = str(exc)
        else:
            run_in_llama_cpp.append(mutation.name)
    assert all("\n" not in line and line.startswith("mutated.gguf is not a GGUF") for line in refused.values())
    for aborted_before in ("block_count=0", "block_count=513", "expert_used_count=2", "expert_count=2"):
        assert aborted_before in refused  # (SIGABRT inside llama.cpp before the check)
    for segfaulted_before in ("blk.0.ffn_down.weight as Q8_K", "token_embd.weight as I32"):
        assert "which llama.cpp computes no weight in" in refused[segfaulted_before]
    assert (
        "llama.attention.layer_norm_rms_epsilon is -1: an epsilon is never negative"
        in refused["attention.layer_norm_rms_epsilon=-1.0"]
    )

    done = subprocess.run(
        [sys.executable, str(MUTANTS), *run_in_llama_cpp],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=MUTANTS.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    results = [line for line in done.stdout.splitlines() if " -> " in line]
    tried = [line.removeprefix("trying ") for line in done.stdout.splitlines() if line.startswith("trying ")]
    assert done.returncode == 0, f"{tried[-1] if tried else '?'} ended the process: {done.stderr[-2000:]}"
    assert len(results) == len(run_in_llama_cpp) >= 20
    for line in results:
        code, errors, traceback, said = line.split(" -> ")[1].split(" | ", 3)
        assert (code, errors) in {("0", "0"), ("2", "1")} and traceback == "False", line
        if "could not load" in said:  # (llama.cpp's own reason, from its log: "invalid n_rot: 63, expected 64")
            assert ": it says: " in said, line


@pytest.mark.hostile
@pytest.mark.parametrize("backend", ["llama.cpp", "transformers"])
def test_block_count_0_is_one_line_and_exit_2_in_either_backend(tmp_path, backend):
    """llama.cpp aborted (GGML_ASSERT n_layer_all > 0), transformers' loader raised an IndexError."""
    from gguf_mutations import Mutation, write_mutation

    path = write_mutation(Mutation("block_count=0", "llama.block_count", value=0), tmp_path / "block0.gguf")
    command = [sys.executable, "-m", "tokenviz", "trace", "The Eiffel Tower is located in", "--steps", "2"]
    done = subprocess.run(
        [*command, "--backend", backend, "--model", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "llama.block_count is 0: llama.cpp takes 1 to 512 layers" in errors[0]
