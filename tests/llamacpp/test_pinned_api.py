"""llama-cpp-python's private API is reached from one module (backends/llamacpp/pinned.py), written for
the version the extra pins: another version is checked for what tokenviz calls, and what it lacks is one
line. These read the code and the package's metadata; they need no llama.cpp."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

import tokenviz
from tokenviz.backends.llamacpp import ggml, pinned
from tokenviz.contract.errors import TokenvizError

BACKEND = Path(tokenviz.__file__).parent / "backends" / "llamacpp"
ROOT = Path(tokenviz.__file__).parents[1]


def called_of_the_library() -> set[str]:
    """Every name the backend reads of a `lib` (the bindings or ggml's library), and of `bindings`."""
    names = set()
    for path in BACKEND.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name | ast.Attribute):
                owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
                if owner in ("lib", "bindings"):
                    names.add(node.attr)
    return names


def test_what_tokenviz_calls_of_llama_cpp_is_listed_where_it_is_checked():
    bound_by_ggml = set(ggml._TENSORS) | set(ggml._GRAPHS)
    assert called_of_the_library() - bound_by_ggml - {"argtypes"} == set(pinned.LLAMA_FUNCTIONS)


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [alias.name for alias in node.names] if isinstance(node, ast.Import) else []


def test_only_the_pinned_module_imports_llama_cpp_python():
    importers = {
        path.name
        for path in BACKEND.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if any(name.startswith("llama_cpp") for name in imported(node))
    }
    assert importers == {"pinned.py"}, importers


def test_the_version_written_for_is_the_one_the_extra_pins():
    pins = re.findall(r'"llama-cpp-python==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pins == [pinned.WRITTEN_FOR]


def test_another_version_that_lacks_a_function_is_one_line_naming_it(monkeypatch):
    library = types.SimpleNamespace(**{name: object() for name in pinned.LLAMA_FUNCTIONS[2:]})
    monkeypatch.setattr(pinned, "version", lambda: "9.9.9")
    with pytest.raises(TokenvizError) as caught:
        pinned.checked(library, pinned.LLAMA_FUNCTIONS)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("llama-cpp-python 9.9.9 lacks LLAMA_FLASH_ATTN_TYPE_DISABLED, ")
    assert f"written for {pinned.WRITTEN_FOR} (pip install llama-cpp-python=={pinned.WRITTEN_FOR})" in line
    whole = types.SimpleNamespace(**{name: object() for name in pinned.LLAMA_FUNCTIONS})
    assert pinned.checked(whole, pinned.LLAMA_FUNCTIONS) is whole
