import os
import sys
from pathlib import Path

import pytest

# No test may reach a model hub: this machine, and CI, reach only the package registries.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

from tiny import tiny_model


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the tests with a device parameter (the tiny models, the bundled one) run",
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
