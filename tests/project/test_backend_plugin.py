"""A backend is a plugin: one registered in the tests alone (the registry's table, as an entry point of its
own would put it there) runs `trace` and the app with no change anywhere else; and the built-in backends
are the entry points tokenviz declares."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from apptools import settle, wait_for
from clitools import invoke
from fixed_backend import PEAK, VOCAB, FixedBackend, FixedModel

from tokenviz.backends.registry import GROUP, registered_backends
from tokenviz.contract import engine as engine_contract
from tokenviz.contract.engine import Capability, in_order
from tokenviz.contract.errors import TokenvizError


def test_the_built_in_backends_are_the_entry_points_tokenviz_declares():
    assert {e.name for e in entry_points(group=GROUP)} >= {"transformers", "server", "llama.cpp"}
    assert next(iter(registered_backends())) == "transformers"


def test_a_backend_registered_in_the_tests_alone_runs_trace(fixed, monkeypatch, capsys):
    code, out, err = invoke(monkeypatch, capsys, "trace", "abc", "--backend", "fixed", "--steps", "3", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["text"] == "def" and doc["model"]["name"] == "fixed"
    peak = float(torch.softmax(torch.tensor([PEAK] + [0.0] * (VOCAB - 1)), 0)[0])
    assert doc["steps"][0]["top"][0]["prob"] == pytest.approx(peak)


async def test_a_backend_registered_in_the_tests_alone_runs_the_app(fixed):
    from tokenviz.cli.backend_options import BackendChoice
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    settings = SamplingSettings(temperature=0)
    choice = BackendChoice("app", {"backend_name": "fixed"}, frozenset({"backend_name"}))
    loader = choice.loader(settings)
    app = TokenvizApp(EngineWorker(loader, settings, "abc"))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await wait_for(lambda: "".join(c.text for c in app.journey.snapshot.chips) == "abcde", pilot)


HOSTILE_NAME = "fixed\x1b]52;c;eA==\x07\x1b[2J\u202etxt.exe"


class LoudEngine(FixedModel):
    """A plugin's engine whose own words (its name, its refusals) hold escape sequences and a bidirectional
    control: said through tokenviz, they reach no terminal raw."""

    def __init__(self) -> None:
        super().__init__()
        self.info = dataclasses.replace(self.info, name=HOSTILE_NAME, architecture="\x1b[31mred")

    def chat_ids(self, user, system=None):
        raise TokenvizError("no chat\x1b[2J here\u202e")


def test_a_plugin_engines_own_words_are_made_safe_at_the_boundary(fixed, monkeypatch, capsys):
    monkeypatch.setattr(FixedBackend, "loader", lambda self, opening: lambda progress: LoudEngine())
    code, out, err = invoke(monkeypatch, capsys, "trace", "abc", "--backend", "fixed", "--steps", "1", "--json")
    assert code == 0 and "\x1b" not in out + err and "\u202e" not in out + err, err
    assert json.loads(out)["model"]["name"] == "fixed<0x1B>]52;c;eA==<0x07><0x1B>[2J<0x202E>txt.exe"
    code, out, err = invoke(monkeypatch, capsys, "trace", "abc", "--backend", "fixed", "--chat")
    assert code == 2 and "\x1b" not in out + err and "\u202e" not in out + err and "no chat<0x1B>[2J" in err, err


async def test_a_plugin_engines_refusal_reaches_the_app_made_safe(fixed, monkeypatch):
    from tokenviz.cli.backend_options import BackendChoice
    from tokenviz.contract.commands import Start
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    monkeypatch.setattr(FixedBackend, "loader", lambda self, opening: lambda progress: LoudEngine())
    settings = SamplingSettings(temperature=0)
    choice = BackendChoice("app", {"backend_name": "fixed"}, frozenset({"backend_name"}))
    worker = EngineWorker(choice.loader(settings), settings, "abc")
    app = TokenvizApp(worker)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        assert app.journey.snapshot.info.name.startswith("fixed<0x1B>]52")
        worker.submit(Start("hi", chat=True))
        await wait_for(lambda: "no chat" in (app.journey.snapshot.error or ""), pilot)
        assert app.journey.snapshot.error == "no chat<0x1B>[2J here<0x202E>"


def test_a_capability_declared_without_its_protocol_is_one_line_naming_the_backend():
    from tokenviz.contract.engine import require
    from tokenviz.journey.stepped_engine import as_engine

    engine = as_engine(FixedModel())
    assert require(engine, Capability.STEP, "a step") is engine
    engine.info = dataclasses.replace(engine.info, capabilities=in_order({Capability.STEP, Capability.LENS}))
    with pytest.raises(TokenvizError, match="the logit lens: fixed's backend declares its logit lens without giving"):
        require(engine, Capability.LENS, "the logit lens")


def test_the_engine_contract_is_typed_throughout():
    """contract/engine.py names no `Any`: what a pass returns, a cache, a tokenizer and a capability are
    typed, so mypy checks each backend's engine against them (the backends' `conforms`)."""
    source = Path(engine_contract.__file__).read_text()
    names = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    assert "Any" not in names | attributes


PACKAGE = Path(engine_contract.__file__).parents[1]


def _trees(folder: Path, leaving_out: Path | None = None) -> Iterable[tuple[Path, ast.AST]]:
    for path in sorted(folder.rglob("*.py")):
        if leaving_out is None or leaving_out not in path.parents:
            yield path, ast.parse(path.read_text())


def test_nothing_outside_the_backends_asks_which_backend_it_has():
    """No module outside tokenviz/backends/ checks an engine's class (isinstance of a class a backend
    defines) or reads `top_only` (what a distribution covers is ModelInfo.covers, said as data); no
    command declares a backend's own option (--endpoint, --api-key, --tokenizer: the backends declare them)."""
    backends = PACKAGE / "backends"
    theirs = {
        node.name for _, tree in _trees(backends) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    } - {"Protocol"}
    asked = []
    for path, tree in _trees(PACKAGE, leaving_out=backends):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                named = {getattr(kind, "id", getattr(kind, "attr", None)) for kind in kinds}
                asked += [f"{path.name}:{node.lineno} isinstance of {name}" for name in named & theirs]
            if isinstance(node, ast.Attribute) and node.attr == "top_only":
                asked.append(f"{path.name}:{node.lineno} reads top_only")
    assert asked == []
    for path, tree in _trees(PACKAGE / "cli" / "commands"):
        options = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in (
            "--endpoint", "--api-key", "--tokenizer")}  # fmt: skip
        assert not options, f"{path.name} declares {options}"
