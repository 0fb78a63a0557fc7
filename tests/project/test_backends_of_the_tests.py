"""Backends registered in the tests alone run every command, and the app in a real terminal at 80x24 and
in a browser, with no change outside tests/: one that steps
(tests/fixed_backend.py, the least a backend gives: a Stepping) and one whose runtime draws each token
itself and says only its top 5, keeping no cache here (tests/drawing_backend.py, a DrawingModel, as a
server's API is). What each shows is that model's own: its draws, its top 5, its log-probabilities."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from apptools import settle, wait_for
from browser import SEEN, chromium, frames, free_port, needs_browser, press, until
from clitools import invoke
from drawing_backend import BACKEND as DRAWING
from drawing_backend import TOP_N, DrawingFixed, logprobs_after
from fixed_backend import BACKEND as FIXED
from terminals import keys, quits_cleanly, terminal, wait_screen

from tokenviz.backends.registry import registered_backends
from tokenviz.contract.settings import SamplingSettings

TESTS = Path(__file__).parents[1]
PROMPT = "abc"
TOLERANCE = 1e-9  # nats: the same float64 numbers, through tokenviz's records and JSON


@pytest.fixture
def ours(monkeypatch):
    """Both backends registered for one test, as an entry point of their own would put them."""
    monkeypatch.setitem(registered_backends(), "fixed", FIXED)
    monkeypatch.setitem(registered_backends(), "drawn", DRAWING)


def drawn_journey(steps: int, settings: SamplingSettings) -> list[int]:
    """The tokens the drawing model itself draws after the prompt, each draw carrying the whole context."""
    model = DrawingFixed()
    ids = model.encode(PROMPT)
    for _ in range(steps):
        ids.append(model.draw(ids, settings).chosen)
    return ids[len(PROMPT) :]


def trace(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, "--json", *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_trace_on_the_drawing_backend_gives_its_draws_and_its_top_5(ours, monkeypatch, capsys, temperature):
    doc = trace(monkeypatch, capsys, "--backend", "drawn", "--steps", "6", "--temperature", temperature, "--seed", "3")
    settings = SamplingSettings(temperature=float(temperature), seed=3)
    assert [s["chosen"]["id"] for s in doc["steps"]] == drawn_journey(6, settings)
    ids = DrawingFixed().encode(PROMPT)
    for step in doc["steps"]:
        own = logprobs_after(ids)
        top = torch.topk(own, TOP_N)
        assert [c["id"] for c in step["top"]] == top.indices.tolist()
        for candidate, logprob in zip(step["top"], top.values.tolist()):
            assert math.isclose(candidate["logprob"], logprob, abs_tol=TOLERANCE)
        ids.append(step["chosen"]["id"])
    assert doc["model"]["covers"] == TOP_N and doc["model"]["numbers_of"] == "its runtime"


def test_score_on_the_drawing_backend_is_its_own_log_probabilities(ours, monkeypatch, capsys):
    text = "abcdxyz"
    code, out, err = invoke(monkeypatch, capsys, "score", text, "--backend", "drawn", "--json")
    assert code == 0, err
    ids = DrawingFixed().encode(text)
    scored = json.loads(out)["tokens"]
    assert [t["id"] for t in scored] == ids[1:]
    for position, token in enumerate(scored, 1):
        own = logprobs_after(ids[:position])
        assert math.isclose(token["logprob"], float(own[ids[position]]), abs_tol=TOLERANCE), token
        assert token["rank"] == int((own > own[ids[position]]).sum()) + 1


def test_compare_puts_the_drawing_backend_beside_the_stepping_one(ours, monkeypatch, capsys):
    code, out, err = invoke(
        monkeypatch, capsys, "compare", PROMPT, "--backend", "fixed", "--against-backend", "drawn",
        "--steps", "4", "--temperature", "0", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["text"] == "defg"  # (the fixed model: the character after the last)
    assert [s["chosen"]["id"] for s in doc["b"]["steps"]] == drawn_journey(4, SamplingSettings(temperature=0))


@pytest.mark.parametrize("backend", ["fixed", "drawn"])
def test_replay_verify_reproduces_a_journey_of_either_and_finds_an_edited_number(
    ours, monkeypatch, capsys, tmp_path, backend
):
    path = tmp_path / "journey.json"
    args = ("--backend", backend, "--steps", "5", "--temperature", "0.8", "--seed", "11", "--save", str(path))
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args)
    assert code == 0, err
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--backend", backend)
    assert code == 0 and out.startswith("verified: all 5 steps reproduce"), out + err
    saved = json.loads(path.read_text())
    saved["steps"][2]["chosen"]["id"] = (saved["steps"][2]["chosen"]["id"] + 1) % 96
    path.write_text(json.dumps(saved))
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--backend", backend)
    assert code == 1 and "mismatch: step 2 differs from the recording" in err, out + err


@pytest.mark.parametrize("backend", ["fixed", "drawn"])
async def test_the_app_steps_on_either(ours, backend):
    from tokenviz.cli.backend_options import BackendChoice
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    settings = SamplingSettings(temperature=0)
    choice = BackendChoice("app", {"backend_name": backend}, frozenset({"backend_name"}))
    app = TokenvizApp(EngineWorker(choice.loader(settings), settings, PROMPT))
    expected = "de" if backend == "fixed" else DrawingFixed().decode(drawn_journey(2, settings))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await wait_for(lambda: "".join(c.text for c in app.journey.snapshot.chips) == PROMPT + expected, pilot)


def installed(folder: Path) -> dict[str, str]:
    """The environment in which both backends are a package's entry points (in `folder`, never in the
    test environment), as a plugin distribution would make them."""
    info = folder / "tokenviz_test_backends-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenviz-test-backends\nVersion: 1.0\n")
    points = "[tokenviz.backends]\nfixed = fixed_backend:BACKEND\ndrawn = drawing_backend:BACKEND\n"
    (info / "entry_points.txt").write_text(points)
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.terminal
@pytest.mark.parametrize("backend", ["fixed", "drawn"])
def test_either_steps_in_a_real_terminal_at_80x24(tmp_path, backend):
    expected = "de" if backend == "fixed" else DrawingFixed().decode(drawn_journey(2, SamplingSettings(temperature=0)))
    with terminal((80, 24), PROMPT, "--backend", backend, "--temperature", "0", env=installed(tmp_path)) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        text = wait_screen(name, r"step 2 · 5 tokens")
        assert PROMPT + expected in text.replace("\n", ""), text
        quits_cleanly(name)


@pytest.mark.terminal
@needs_browser
def test_serve_runs_the_drawing_backend_in_a_browser_tab(tmp_path):
    port = free_port()
    env = {**os.environ, **installed(tmp_path)}
    command = [sys.executable, "-m", "tokenviz", "serve", PROMPT, "--backend", "drawn", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        until(lambda: server.poll() is not None or socket.socket().connect_ex(("127.0.0.1", port)) == 0, 60, 0.2)
        assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
        with chromium() as browser:
            SEEN.clear()
            browser.get(f"http://127.0.0.1:{port}")
            until(lambda: "ready · step 0" in frames(browser), 120, 0.2)
            press(browser, " ")
            until(lambda: "step 1 · 4 tokens" in frames(browser), 120, 0.2)
    finally:
        server.terminate()
        server.wait(10)
