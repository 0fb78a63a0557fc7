"""How the test command's pytest-xdist workers (`-n auto --dist loadgroup`) share the work.

The tests that share a session's costly fixture run on one worker, so it is made once a run: the vLLM
servers and their environment, the llama-cpp-python build. That worker mostly waits on its server, so
there is a worker more than the machine has cores.
"""

from __future__ import annotations

import os

import pytest

SHARED_FIXTURES = {
    "vllm_environment": "vllm-server",
    "llama_cpp_build": "llama-cpp-build",
    "sae_libraries": "sae-libraries",
}
MOST_WORKERS = 6  # each holds models (a GB or more)


def auto_workers() -> int:
    return min((os.cpu_count() or 1) + 1, MOST_WORKERS)


def groups(item: pytest.Item) -> set[str]:
    """The xdist groups of a test: those of the shared fixtures it uses."""
    return {group for name, group in SHARED_FIXTURES.items() if name in item.fixturenames}
