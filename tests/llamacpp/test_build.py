"""llama-cpp-python builds on this machine (tests/llamacpp/conftest.py)."""

import pytest

pytestmark = pytest.mark.llamacpp


def test_llama_cpp_python_builds(llama_cpp_build):
    assert llama_cpp_build.failure is None, llama_cpp_build.failure
    import llama_cpp

    assert llama_cpp.__version__


def test_llama_perplexity_builds(llama_perplexity_build):
    """llama.cpp's own llama-perplexity, the reference of `score --against-model`, builds from the vendored
    sources; a failure names the compiler's last lines (the tests that need it are skipped, naming this)."""
    assert llama_perplexity_build.failure is None, llama_perplexity_build.failure
    assert llama_perplexity_build.path.stat().st_size > 0
