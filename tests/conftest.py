import os
import sys
from pathlib import Path

import pytest

# No test may reach a model hub: this machine, and CI, reach only the package registries.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).parent))

from tiny import tiny_model


@pytest.fixture(params=["llama", "gpt2"])
def tiny(request):
    return tiny_model(request.param)


@pytest.fixture
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2-135M on the CPU in float32 (converted once into the user cache)."""
    from tokenviz.model.loading import load_model

    return load_model(None, device="cpu", dtype="float32")
