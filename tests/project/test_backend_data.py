"""What differs between backends is said by the backend as data, so a backend registered in the tests
alone gets each behaviour by saying it: a replay checks a recording whole where the engine says its
recordings are all its numbers (ModelInfo.reproduced_within), and a journey whose steps were requests is
verified only where they are requests again, the line naming how it was opened (ModelInfo.reopen)."""

from __future__ import annotations

import dataclasses
import json

from apptools import model_rows, model_text
from clitools import invoke
from fixed_backend import FixedBackend, FixedModel

from tokenviz.backends.registry import registered_backends
from tokenviz.contract.errors import TokenvizError


class WholeEngine(FixedModel):
    """The fixed engine, saying its recordings are all its numbers (as a server's are); its logits fall
    by a little from token to token, so no two tie (a top N of ties is any N of them)."""

    def __init__(self, requests: str = "", reopen: str = "") -> None:
        super().__init__()
        self.info = dataclasses.replace(self.info, reproduced_within=1e-6, requests=requests, reopen=reopen)

    def forward(self, ids):
        return [logit - i * 1e-3 for i, logit in enumerate(super().forward(ids))]


def opening(engine: FixedModel):
    return lambda self, opening: lambda progress: engine


def recorded(monkeypatch, capsys, tmp_path, name: str = "fixed") -> tuple[str, dict]:
    path = tmp_path / f"{name}.json"
    code, _, err = invoke(
        monkeypatch, capsys, "trace", "abc", "--backend", "fixed", "--steps", "3", "--save", str(path)
    )
    assert code == 0, err
    return str(path), json.loads(path.read_text())


def test_an_engine_that_says_its_recordings_are_its_numbers_has_them_checked_whole(
    fixed, monkeypatch, capsys, tmp_path
):
    path, saved = recorded(monkeypatch, capsys, tmp_path)
    code, out, err = invoke(monkeypatch, capsys, "replay", path, "--verify", "--backend", "fixed")
    assert code == 0 and out.strip() == "verified: all 3 steps reproduce the recorded tokens", err  # (tokens alone)
    monkeypatch.setattr(FixedBackend, "loader", opening(WholeEngine()))
    path, saved = recorded(monkeypatch, capsys, tmp_path, "whole")
    code, out, err = invoke(monkeypatch, capsys, "replay", path, "--verify", "--backend", "fixed")
    assert code == 0 and "reproduce the recorded journey: every token, text, number and analysis" in out, err
    saved["replay"]["records"][1]["top"][1][3] += 0.01  # a candidate's probability (a number no token check sees)
    (tmp_path / "edited.json").write_text(json.dumps(saved))
    code, out, err = invoke(
        monkeypatch, capsys, "replay", str(tmp_path / "edited.json"), "--verify", "--backend", "fixed"
    )
    assert code == 1 and "\nmismatch: replay.records[1].top[1][3] is 0.0143" in err, err


def test_a_journey_of_requests_is_verified_only_where_its_steps_are_requests_again(
    fixed, monkeypatch, capsys, tmp_path
):
    path, _ = recorded(monkeypatch, capsys, tmp_path)
    asked = "tokenviz --endpoint URL (the server at 127.0.0.1:8000)"
    monkeypatch.setattr(FixedBackend, "loader", opening(WholeEngine("the fixed server", asked)))
    code, _, err = invoke(monkeypatch, capsys, "replay", path, "--verify", "--backend", "fixed")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "the journey's steps were passes in this process, not requests to the fixed server" in errors[0]
    served, _ = recorded(monkeypatch, capsys, tmp_path, "served")
    code, _, err = invoke(monkeypatch, capsys, "replay", served, "--verify")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "the journey on fixed was requests to the fixed server" in errors[0], err
    assert asked in errors[0] and "Traceback" not in err
    code, out, err = invoke(monkeypatch, capsys, "replay", served, "--verify", "--backend", "fixed")
    assert code == 0 and "reproduce the recorded journey" in out, err  # (requests again: checked whole)


async def test_the_model_view_shows_the_rows_a_backend_says_of_its_model(fixed, monkeypatch):
    """The model view draws one way for every backend: what is particular to one is its `details` and its
    `lacks_why`, rows it fills (a server's "each step", llama.cpp's threads), never a branch on which it is."""
    from apptools import settle, wait_for

    from tokenviz.cli.backend_options import BackendChoice
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    engine = FixedModel()
    said = (("each step", "one pigeon\x1b[2J carrying the ids"),)  # (a plugin's words: made safe on the way in)
    engine.info = dataclasses.replace(engine.info, layers=0, details=said, lacks_why=(("logit lens", "none"),))
    monkeypatch.setattr(FixedBackend, "loader", opening(engine))
    settings = SamplingSettings(temperature=0)
    choice = BackendChoice("app", {"backend_name": "fixed"}, frozenset({"backend_name"}))
    app = TokenvizApp(EngineWorker(choice.loader(settings), settings, "abc"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("M")
        pane = app.query_one("#model")
        await wait_for(lambda: "each step" in model_text(pane), pilot)
        lines = model_rows(pane)
        assert any(line.startswith("each step") and "one pigeon<0x1B>[2J carrying the ids" in line for line in lines)
        assert any(line.startswith("no logit lens") and line.endswith("none") for line in lines)
        body = " ".join(lines)
        assert body.count("logit lens") == 1 and "kv cache" in body, body  # (its row says it: not the engine's too)
        assert not any(line.startswith("layers") for line in lines)  # (no shape rows: it says it has none)


class FixedServer(FixedBackend):
    """A backend of the tests' own whose weights are not here, which (as a server's) takes no --model."""

    name, weights_here = "fixed-server", False

    def loader(self, opening):
        if opening.model is not None:
            raise TokenvizError("--model is for a model loaded here")
        return lambda progress: WholeEngine("the fixed server")


def test_a_journey_run_here_verified_on_a_backend_without_weights_is_told_how_it_ran(
    fixed, monkeypatch, capsys, tmp_path
):
    """It was named by its model for the check (--model), which such a backend refuses: the line said so,
    not how the journey ran."""
    monkeypatch.setitem(registered_backends(), "fixed-server", FixedServer())
    path, _ = recorded(monkeypatch, capsys, tmp_path)
    code, _, err = invoke(monkeypatch, capsys, "replay", path, "--verify", "--backend", "fixed-server")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert "the journey's steps were passes in this process, not requests to the fixed server" in errors[0]
    assert "--model is for a model loaded here" not in err  # (it was not given: nothing to refuse)
