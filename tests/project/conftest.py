import pytest
from fixed_backend import FixedBackend

from tokenviz.backends.registry import registered_backends


@pytest.fixture
def fixed(monkeypatch):
    """The tests' own fixed backend, registered for one test (as an entry point of its own would put it)."""
    monkeypatch.setitem(registered_backends(), "fixed", FixedBackend())
