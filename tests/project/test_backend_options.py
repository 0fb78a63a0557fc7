"""Every backend's options are its own: transformers declares where and how its model loads as the others
declare theirs, the command line takes an option only with a backend that declares it (one line naming
the backends that do), and no module outside tokenviz/backends/ declares one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from clitools import invoke

import tokenviz
from tokenviz.backends.registry import registered_backends
from tokenviz.contract.backend import BackendOption, Opening

PACKAGE = Path(tokenviz.__file__).parent
LOADING = {"device", "dtype", "trust_remote_code", "device_map", "max_memory", "offload_dir", "quantize", "compile"}


class TakesDtype:
    """A backend of the tests' own that declares an option of transformers' name."""

    name, about = "dtyped", "a backend declaring --dtype too (the tests' own)"
    weights_here, draws = True, False
    options = (BackendOption("dtype", "its own dtype"),)

    def asked(self, given: frozenset[str]) -> bool:
        return False

    def loader(self, opening: Opening):
        raise AssertionError(f"not opened: {opening.text('dtype')}")


def test_transformers_declares_its_loading_options_as_every_backend_declares_its_own():
    assert {o.name for o in registered_backends()["transformers"].options} == LOADING
    assert {o.kind for o in registered_backends()["transformers"].options if o.name == "max_memory"} == {"texts"}


def test_no_module_outside_the_backends_declares_a_backends_option():
    """The CLI builds each backend's options from what the backend declares: none is written out in it."""
    flags = {o.flag for backend in registered_backends().values() for o in backend.options}
    written = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "backends" in path.parents:
            continue
        tree = ast.parse(path.read_text())
        written += [
            f"{path.name}:{n.lineno} {n.value}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and n.value in flags
        ]
    assert written == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--backend", "llama.cpp", "--dtype", "float16"], "--dtype is the transformers backend's option: it goes "
         "with --backend transformers"),
        (["--backend", "llama.cpp", "--max-memory", "cpu=1GB"], "--max-memory is the transformers backend's option"),
        (["--threads", "2"], "--threads is the llama.cpp backend's option: it goes with --backend llama.cpp"),
        (["--backend", "llama.cpp", "--tokenizer", "x"], "--tokenizer is the server backend's option: it goes with "
         "--backend server"),
    ],
)  # fmt: skip
def test_an_option_the_chosen_backend_lacks_is_one_line_naming_the_backends_that_take_it(
    monkeypatch, capsys, args, said
):
    code, out, err = invoke(monkeypatch, capsys, "trace", "x", *args)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and out == "" and len(errors) == 1 and said in errors[0] and "Traceback" not in err, err


def test_an_option_two_backends_declare_names_both_and_goes_with_either(monkeypatch, capsys):
    monkeypatch.setitem(registered_backends(), "dtyped", TakesDtype())
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--backend", "llama.cpp", "--dtype", "float16")
    assert (
        code == 2
        and "--dtype is the transformers, dtyped backends' option: it goes with --backend transformers or dtyped" in err
    ), err
    with pytest.raises(AssertionError, match="not opened: float16"):  # (its own value reached its loader)
        invoke(monkeypatch, capsys, "trace", "x", "--backend", "dtyped", "--dtype", "float16")


def test_the_transformers_options_reach_its_loader_checked_before_torch(monkeypatch, capsys):
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--compile", "--device-map", "auto")
    assert code == 2 and "--compile runs a model on one device; --device-map spreads it: choose one" in err, err
    code, _, err = invoke(monkeypatch, capsys, "trace", "x", "--max-memory", "cpu=lots")
    assert code == 2 and "'lots' is not a size" in err, err


def test_no_module_outside_the_backends_asks_where_or_in_which_runtime_a_model_runs():
    """What differs between backends is said as data by the backend (what a step is, whom its numbers
    are, how to open it again, why it lacks a capability): nothing outside tokenviz/backends/ reads where a
    model runs or tests its runtime's name."""
    asked = []
    names = {backend.name for backend in registered_backends().values()} | {"vllm", "vLLM", "vllm-lens"}
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "backends" in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("remote", "local"):
                asked.append(f"{path.name}:{node.lineno} reads {node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "endswith"):
                said = [a.value for a in node.args if isinstance(a, ast.Constant)]
                asked += [f"{path.name}:{node.lineno} asks for {s}" for s in said if s in names]
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in names - {"transformers"} for c in node.comparators
            ):
                asked.append(f"{path.name}:{node.lineno} compares with a backend's name")
    assert asked == []
    script = (PACKAGE / "files" / "journey_page.js").read_text()
    assert ".remote" not in script and "llama.cpp" not in script


def test_compares_b_option_its_backend_lacks_is_one_line(monkeypatch, capsys):
    """--against-option NAME=VALUE sets one of B's backend's own options (compare names none): one B's backend
    does not declare, or a value not of its kind, is one line before anything loads, naming its options."""
    llama = ("compare", "x", "--against-backend", "llama.cpp", "--against-option")
    for args, said in (
        ((*llama, "dtype=float16"), "--against-option 'dtype=float16': give NAME=VALUE of an option of llama.cpp's:"),
        ((*llama, "threads=many"), "--against-option --threads: give a whole number, not 'many'"),
        ((*llama, "threads=²"), "--against-option --threads: give a whole number, not '²'"),
        ((*llama, "flash-attention"), "--against-option 'flash-attention': give NAME=VALUE of an option of"),
        (("compare", "x", "--against-option", "trust-remote-code=maybe"), "give on or off, not 'maybe'"),
    ):
        code, _, err = invoke(monkeypatch, capsys, *args)
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 2 and len(errors) == 1 and said in errors[0], err
        assert "NAME=VALUE" not in said or "flash-attention" in errors[0]  # its options named
