"""The smallest backend docs/ARCHITECTURE.md shows, run as it is written there: a reader can copy it."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

from clitools import invoke

from tokenviz.backends.registry import registered_backends

ARCHITECTURE = Path(__file__).parents[2] / "docs/ARCHITECTURE.md"


def example() -> types.ModuleType:
    """The one code block of the section on backends that defines BACKEND, as a module."""
    blocks = re.findall(r"```python\n(.*?)```", ARCHITECTURE.read_text(), re.S)
    (source,) = [block for block in blocks if "\nBACKEND = " in block]
    module = types.ModuleType("architecture_example")
    exec(compile(source, str(ARCHITECTURE), "exec"), module.__dict__)
    return module


def test_the_smallest_backend_of_the_architecture_runs_trace_and_score(monkeypatch, capsys):
    monkeypatch.setitem(registered_backends(), "fixed", example().BACKEND)
    code, out, err = invoke(monkeypatch, capsys, "trace", "abc", "--backend", "fixed", "--steps", "3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["text"] == "def" and doc["model"]["name"] == "fixed" and len(doc["steps"]) == 3
    code, out, err = invoke(monkeypatch, capsys, "score", "abcdx", "--backend", "fixed", "--json")
    assert code == 0, err
    scored = json.loads(out)
    # Each character is the one the model puts first after the last; x after d is one of the 95 it ties below.
    assert [(t["text"], t["rank"]) for t in scored["tokens"]] == [("b", 1), ("c", 1), ("d", 1), ("x", 2)]
