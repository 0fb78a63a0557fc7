import os
import sys
from pathlib import Path

import pytest

# No test may reach a model hub: this machine, and CI, reach only the package registries.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

# pytest-xdist's workers share the machine's cores: each (and each process a test starts) takes its share
# of threads, so that torch's threads do not outnumber the cores and wait on one another. xdist gives its
# workers COLUMNS=80 and LINES=24, which a tokenviz started in a tmux terminal would take for its size.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // WORKERS))
for name in ("COLUMNS", "LINES"):
    os.environ.pop(name, None)
# A machine that asks Python not to write bytecode (PYTHONDONTWRITEBYTECODE: CI's does) would have each of
# the few hundred processes the tests start compile tokenviz from its source again (0.3 s of a core each):
# they write it once and read it after, as on a user's machine.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
from scratch import scratch_dir  # noqa: E402

# The app keeps its journey's journal in the user's state folder: each test process (and the apps it
# starts) has its own, so no test meets a journal another left.
os.environ["XDG_STATE_HOME"] = scratch_dir("tokenviz-test-state-")

import workers  # noqa: E402
from tiny import tiny_model  # noqa: E402  (after the threads are set: it imports torch)


def pytest_xdist_auto_num_workers(config):
    return workers.auto_workers()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items):
    for item in items:
        for group in workers.groups(item):
            item.add_marker(pytest.mark.xdist_group(group))
        if "bundled" in getattr(item, "fixturenames", ()):  # (a test on the bundled model is one, marked or not)
            item.add_marker(pytest.mark.bundled)


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the tests with a device parameter (the tiny models, the bundled one) run",
    )
    parser.addoption(
        "--gpu-layers",
        type=int,
        default=0,
        help="the layers each GGUF's llama.cpp truth tests offload to the GPU, in tokenviz and in llama-cpp-python's "
        "own Llama alike (llama_reference.offloaded; llama-cpp-python built for the GPU)",
    )


@pytest.fixture(scope="session")
def device(request) -> str:
    """The device of `--device`: the tiny and bundled models of the tests that take them live there."""
    return request.config.getoption("--device")


@pytest.fixture(params=["llama", "gpt2"])
def tiny(request, device):
    return tiny_model(request.param, device=device)


@pytest.fixture
def tiny_llama(device):
    return tiny_model("llama", device=device)


@pytest.fixture(scope="session")
def bundled(device):
    """The bundled SmolLM2-135M in float32 (converted once into the user cache), on the CPU unless
    `--device` says."""
    from tokenviz.backends.transformers.loading import load_model

    return load_model(None, device=device, dtype="float32")


@pytest.fixture(scope="session")
def sae_libraries():
    """SAELens's and sparsify's own environment (tests/sae_reference.py): its python, or why it could not
    be built (a test of its own fails naming it; the others skip)."""
    import sae_reference

    try:
        return sae_reference.Built(sae_reference.ensure(), None)
    except sae_reference.BuildFailed as exc:
        return sae_reference.Built(None, str(exc))
