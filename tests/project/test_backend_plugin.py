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

from tokenviz.backends.registry import GROUP, registered
from tokenviz.contract import engine as engine_contract
from tokenviz.contract.backend import BackendOption, Opening
from tokenviz.contract.engine import WHOLE_VOCABULARY, Capability, in_order
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.records import ModelInfo
from tokenviz.decoding.prompt_predictions import predict_positions

VOCAB = 96  # token i is the character chr(32 + i)
PEAK = 5.0  # the logit of the character after the last


class FixedForward:
    def __init__(self, rows: torch.Tensor):
        self.rows, self.logits, self.routes, self.places = rows, rows[-1], None, None
        self.timer = self

    def wait(self) -> FixedForward:
        return self

    def ms(self) -> float:
        return 0.0

    def predictions(self, next_ids):
        return predict_positions(self.rows, next_ids)


class FixedEngine:
    """The smallest engine: one distribution whatever the context, peaked at the character after the last."""

    def __init__(self) -> None:
        self.info = ModelInfo(
            name="fixed", device="here", dtype="float32", layers=1, heads=1, kv_heads=1, head_dim=1, hidden=1,
            vocab=VOCAB, context=256, architecture="fixed logits", tied_embeddings=False, positions="none",
            capabilities=in_order({Capability.STEP}), distribution=WHOLE_VOCABULARY,
        )  # fmt: skip
        self.special_ids: set[int] = set()
        self.eos_ids: set[int] = set()
        self.device, self.tokenizer, self.cache, self.give_way = torch.device("cpu"), None, (), None
        self.pieces = self

    def piece(self, token_id: int) -> str:
        return chr(32 + token_id)

    def learn(self, ids: Iterable[int]) -> None:
        pass

    learn_pieces = learn

    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        return [(ord(c) - 32) % VOCAB for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.piece(i) for i in ids)

    def chat_ids(self, user, system=None):
        raise TokenvizError("no chat template")

    @property
    def kv_len(self) -> int:
        return len(self.cache)

    kv_bytes = 0

    def use_cache(self, cache) -> None:
        self.cache = tuple(cache)

    def reset(self) -> None:
        self.cache = ()

    def crop(self, length: int) -> None:
        self.cache = self.cache[:length]

    def twin(self) -> FixedEngine:
        return FixedEngine()

    def joined(self, last, routes, places):
        return last

    def read_routing(self, host):
        return None

    def forward(self, ids, every_position=False, cancelled=None, progress=None) -> FixedForward:
        self.cache = (*self.cache, *ids)
        rows = torch.zeros(len(ids), VOCAB)
        rows[range(len(ids)), [(i + 1) % VOCAB for i in ids]] = PEAK
        return FixedForward(rows)


class FixedBackend:
    name, about, local = "fixed", "one distribution whatever the context (the tests' own)", True
    options: tuple[BackendOption, ...] = ()

    def asked(self, given: frozenset[str]) -> bool:
        return False

    def loader(self, opening: Opening):
        return lambda progress: FixedEngine()


@pytest.fixture
def fixed(monkeypatch):
    monkeypatch.setitem(registered(), "fixed", FixedBackend())


def test_the_built_in_backends_are_the_entry_points_tokenviz_declares():
    assert {e.name for e in entry_points(group=GROUP)} >= {"transformers", "server", "llama.cpp"}
    assert next(iter(registered())) == "transformers"


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


class LoudEngine(FixedEngine):
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
    from tokenviz.contract.engine import able

    engine = FixedEngine()
    assert able(engine, Capability.STEP, "a step") is engine
    engine.info = dataclasses.replace(engine.info, capabilities=in_order({Capability.STEP, Capability.LENS}))
    with pytest.raises(TokenvizError, match="the logit lens: fixed's backend declares its logit lens without giving"):
        able(engine, Capability.LENS, "the logit lens")


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
