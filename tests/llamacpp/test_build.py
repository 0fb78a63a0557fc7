"""llama-cpp-python builds on this machine (tests/llamacpp/conftest.py)."""

import pytest

pytestmark = pytest.mark.llamacpp


def test_llama_cpp_python_builds(llama_cpp_build):
    assert llama_cpp_build.failure is None, llama_cpp_build.failure
    import llama_cpp

    assert llama_cpp.__version__
