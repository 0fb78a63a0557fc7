"""A hostile `--tokenizer DIR` for a served model with the vllm-lens plugin (round 6, findings 5 and 6):
the directory whose config, tokenizer and head tensors the lens reads. Each made from the tiny model's
own directory with one lie, against a server (tests/hostile_server.py) that tokenizes as that tokenizer
does and says it has the plugin, so the whole directory is read. Each must be one line (a
TokenvizError) and nothing the lie asks for allocated or waited on; before the fixes they were
tracebacks (SafetensorError, KeyError, ZeroDivisionError, RuntimeError, MemoryError), a 17-45 s
allocation, and a FIFO that hung `trace` and the app for good.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
from hostile_server import completion, hostile_server
from tiny import save_tiny

from tokenviz.backends.served.completions import ServedChoice
from tokenviz.backends.served.engine import ServedEngine
from tokenviz.contract.errors import TokenvizError

CHILD_LIMIT_S = 120  # a hang guard: the refusal comes in seconds


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-head"), "llama", context=64)


@pytest.fixture(scope="module")
def server(original):
    """A server that tokenizes as the tiny model's tokenizer does and answers with activations (the probe's
    sign of the plugin), so the lens's head is read from --tokenizer DIR."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(original)
    vocab = len(tokenizer)
    plain = completion([(i, -3.0 - i) for i in range(20)])

    def tokenize(h) -> None:
        body = h.body()
        text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        h.answer(200, {"tokens": tokenizer(text, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]})

    def detokenize(h) -> None:
        ids = h.body().get("tokens", [])
        h.answer(200, {"prompt": tokenizer.decode(ids) if all(0 <= t < vocab for t in ids) else ""})

    def completions(h) -> None:
        xargs = h.body().get("vllm_xargs") or {}
        if "output_residual_stream" in xargs:  # (the probe: the plugin's sign)
            activations = {"residual_stream": {}, "attn_q": {}, "attn_k": {}}
            h.answer(200, {"choices": [{"logprobs": None}], "activations": activations})
        elif "output_qk" in xargs:  # an attention request: a scale no float holds (round 6, finding 3)
            h.answer(200, b'{"activations": {"qk_meta": {"__json__": [{"scale": ' + b"9" * 401 + b"}]}}}")
        else:
            plain(h)

    with hostile_server() as httpd:
        httpd.routes.update({"/tokenize": tokenize, "/detokenize": detokenize, "/v1/completions": completions})
        yield httpd


def copy_of(original, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(original, directory)
    return directory


def edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, **changes}))


def write_safetensors(path, header: dict, data_size: int, data: bytes = b"") -> None:
    """A safetensors file with `header`, its data `data` then nothing up to `data_size` bytes (sparse)."""
    raw = json.dumps(header).encode()
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(raw)) + raw + data)
    os.truncate(path, 8 + len(raw) + data_size)


def header_and_data(path) -> tuple[dict, bytes]:
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        return json.loads(file.read(length)), file.read()


def lie(kind: str, directory) -> str:
    """Make the lie `kind` in `directory`; what the line must say."""
    weights = directory / "model.safetensors"
    if kind == "a 1 GB header":
        weights.write_bytes(struct.pack("<Q", 1 << 30) + b"{" * 64)
        return "claims a header of 1,073,741,824 bytes"
    if kind == "offsets past the end":
        header, _ = header_and_data(weights)
        entry = next(k for k in header if k != "__metadata__")
        header[entry]["data_offsets"] = [0, 1 << 40]
        write_safetensors(weights, header, 1024)
        return "lies past the end of the file"
    if kind == "a link to /dev/zero":
        weights.unlink()
        weights.symlink_to("/dev/zero")
        return "model.safetensors is not a regular file"
    if kind == "a link to a file that is not safetensors":
        other = directory.parent / "secret"
        other.write_bytes(b"root:$6$salt$hash:19000:0:99999:7:::\n" * 4)
        weights.unlink()
        weights.symlink_to(other)
        return "past the file"
    if kind == "a malformed tokenizer.json":
        (directory / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": [')
        return "cannot load the tokenizer"
    if kind == "a 700 MB tokenizer.json":
        os.truncate(directory / "tokenizer.json", 700 << 20)
        return "tokenizer.json is 734 MB, larger than the"
    return config_lie(kind, directory)


def config_lie(kind: str, directory) -> str:
    if kind == "no attention heads":
        edit_config(directory, num_attention_heads=0)
        return "num_attention_heads 0"
    if kind == "a hidden size of 10^9":
        edit_config(directory, hidden_size=10**9)
        return "hidden_size 1000000000"
    if kind == "a vocabulary of 10^9":
        edit_config(directory, vocab_size=10**9)
        return "vocab_size 1000000000"
    if kind == "a million layers":
        edit_config(directory, num_hidden_layers=10**6)
        return "num_hidden_layers 1000000"
    if kind == "20,000 layers":
        edit_config(directory, num_hidden_layers=20_000)
        return "num_hidden_layers 20000"
    if kind == "a 9 GB sparse embedding":  # (the other tensors kept as they were)
        weights = directory / "model.safetensors"
        header, data = header_and_data(weights)
        name = next(k for k in header if "embed" in k)
        header[name] = {
            "dtype": "F32",
            "shape": [2_400_000, 1000],
            "data_offsets": [len(data), len(data) + 9_600_000_000],
        }
        write_safetensors(weights, header, len(data) + 9_600_000_000, data)
        return "where its config makes it"
    raise AssertionError(kind)


LIES = [
    "a 1 GB header",
    "offsets past the end",
    "a link to /dev/zero",
    "a link to a file that is not safetensors",
    "a malformed tokenizer.json",
    "a 700 MB tokenizer.json",
    "no attention heads",
    "a hidden size of 10^9",
    "a vocabulary of 10^9",
    "a million layers",
    "20,000 layers",
    "a 9 GB sparse embedding",
]


@pytest.mark.parametrize("kind", LIES)
def test_a_lying_model_directory_is_one_line(original, server, tmp_path, kind):
    directory = copy_of(original, tmp_path)
    said = lie(kind, directory)
    with pytest.raises(TokenvizError) as caught:
        ServedEngine.open(ServedChoice(server.url), str(directory))
    line = str(caught.value)
    assert said in line and "\n" not in line, line


def test_the_directory_unchanged_opens_with_its_lens(original, server):
    """(The lies above are refused for what they are: the same directory as saved gives the lens.)"""
    from tokenviz.contract.engine import Capability

    engine = ServedEngine.open(ServedChoice(server.url), original)
    assert Capability.LENS.value in engine.info.capabilities and engine.internals is not None


def test_a_fifo_as_the_weights_is_refused_and_trace_ends(original, server, tmp_path):
    """(Finding 6: `trace` hung on the FIFO and ignored Ctrl-C; the app stayed at "loading 50%".)"""
    directory = copy_of(original, tmp_path)
    (directory / "model.safetensors").unlink()
    os.mkfifo(directory / "model.safetensors")
    done = subprocess.run(
        [sys.executable, "-m", "tokenviz", "trace", "Hello", "--endpoint", server.url, "--tokenizer", str(directory)],
        capture_output=True,
        text=True,
        timeout=CHILD_LIMIT_S,
        stdin=subprocess.DEVNULL,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "model.safetensors is not a regular file" in errors[0]


async def test_attention_rows_a_server_cannot_give_are_a_note_in_the_pane(original, server):
    """(Round 6, finding 3: a 401-digit scale left the attention pane on "computing attention…" with no
    note.) The pane says why, and the journey goes on."""
    from apptools import settle, wait_for

    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    engine = ServedEngine.open(ServedChoice(server.url), original)
    worker = EngineWorker(lambda progress: engine, SamplingSettings(temperature=0, max_new_tokens=100), "Hello")
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        said = "an integer of 401 digits is past any count or id"

        def noted() -> bool:
            view = app.journey.snapshot.attention
            return view is not None and said in view.missing

        await wait_for(noted, pilot, timeout=30)
        pane = app.query_one("AttentionPane")

        def shown() -> str:
            return " ".join(strip.text.strip() for strip in pane.redraw())

        await wait_for(lambda: said in shown(), pilot, timeout=30)
        assert "computing attention" not in shown(), shown()
        await pilot.press("space")
        s = await settle(app, pilot)
        assert len(s.chips) > 1 and s.error is None
