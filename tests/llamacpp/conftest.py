"""llama-cpp-python, the llama.cpp backend's binding: built here when missing (from the package index's
source with the machine's compiler and CMake: about 12 minutes on 2 cores, once a machine; pip keeps the
wheel). A build that fails is one failed test, test_llama_cpp_python_builds, with pip's last lines and the
command to build it by hand; every test that needs it is then skipped, naming that test."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass

import pytest
from llama_reference import pin

BUILD_TEST = "tests/llamacpp/test_build.py::test_llama_cpp_python_builds"
BUILD_S = 3600  # the most a build may take (about 12 minutes on an idle 2-core machine; a busy one, more)


@dataclass(frozen=True)
class Built:
    failure: str | None  # why it could not be built (None: importable)


@pytest.fixture(scope="session")
def llama_cpp_build() -> Built:
    if importlib.util.find_spec("llama_cpp") is not None:
        return Built(None)
    command = [sys.executable, "-m", "pip", "install", pin()]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_S)
    except subprocess.TimeoutExpired:
        return Built(f"building {pin()} took over {BUILD_S} s; build it by hand: {' '.join(command)}")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        return Built(f"{' '.join(command)} failed (exit {done.returncode}); its last lines:\n{tail}")
    importlib.invalidate_caches()
    return Built(None)


@pytest.fixture(scope="session")
def llama_cpp(llama_cpp_build: Built) -> None:
    """llama-cpp-python importable, or the test skipped naming the build's test."""
    if llama_cpp_build.failure is not None:
        pytest.skip(f"llama-cpp-python could not be built (see {BUILD_TEST})")


@pytest.fixture(scope="session", autouse=True)
def offloaded_layers(request) -> None:
    """The test command's --gpu-layers, which both sides of the llama.cpp tests offload (llama_reference)."""
    from llama_reference import GPU_LAYERS

    GPU_LAYERS[0] = request.config.getoption("--gpu-layers")


@pytest.fixture(scope="module")
def reference(llama_cpp):
    """llama-cpp-python's own Llama on the bundled GGUF (llama_reference.own_llama)."""
    from llama_reference import own_llama

    yield from own_llama()


PERPLEXITY_BUILD_TEST = "tests/llamacpp/test_build.py::test_llama_perplexity_builds"


@dataclass(frozen=True)
class BuiltTool:
    path: object  # the binary (None: not built)
    failure: str | None  # why it could not be built


@pytest.fixture(scope="session")
def llama_perplexity_build(llama_cpp_build: Built) -> BuiltTool:
    """llama.cpp's llama-perplexity from the pinned sdist's sources (tests/llamacpp/llama_perplexity.py)."""
    from llama_perplexity import build

    try:
        return BuiltTool(build(), None)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return BuiltTool(None, str(exc))


@pytest.fixture(scope="session")
def llama_perplexity(llama_cpp, llama_perplexity_build: BuiltTool):
    """The llama-perplexity binary, or the test skipped naming the build's test."""
    if llama_perplexity_build.failure is not None:
        pytest.skip(f"llama-perplexity could not be built (see {PERPLEXITY_BUILD_TEST})")
    return llama_perplexity_build.path
