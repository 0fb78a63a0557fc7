"""Backends registered in the tests alone run every command, and the app in a real terminal at 80x24 and
in a browser, with no change outside tests/: one that steps (tests/fixed_backend.py, the least a backend
gives: a Stepping), one whose runtime draws each token itself and says only its top 5, keeping no cache
here (tests/drawn_backend.py, a DrawingModel, as a server's API is), and one with every capability on
fixed weights (tests/whole_backend.py). What each shows is that model's own: its draws, its top 5, its
log-probabilities, its lens and attention rows."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from apptools import settle, wait_for
from browser import SEEN, chromium, frames, free_port, needs_browser, press, until
from clitools import invoke
from drawn_backend import BACKEND as DRAWN
from drawn_backend import TOP_N, DrawingFixed, logprobs_after
from fixed_backend import BACKEND as FIXED
from terminals import keys, quits_cleanly, terminal, wait_screen
from tiny import tiny_model
from whole_backend import BACKEND as WHOLE

from tokenviz.backends.registry import registered_backends
from tokenviz.contract.settings import SamplingSettings

TESTS = Path(__file__).parents[1]
PROMPT = "abc"
BACKENDS = {"fixed": FIXED, "drawn": DRAWN, "whole": WHOLE}
PROMPTS = {"fixed": PROMPT, "drawn": PROMPT, "whole": "The cat"}
TOLERANCE = 1e-9  # nats: the drawn model's float64 numbers, through tokenviz's records and JSON
RECOMPUTED = 1e-4  # nats: the whole backend's cached steps against a full recompute in float32


@pytest.fixture
def ours(monkeypatch):
    """The tests' backends registered for one test, as an entry point of their own would put them."""
    for name, backend in BACKENDS.items():
        monkeypatch.setitem(registered_backends(), name, backend)


def drawn_journey(steps: int, settings: SamplingSettings) -> list[int]:
    """The tokens the drawing model itself draws after the prompt, each draw carrying the whole context."""
    model = DrawingFixed()
    ids = model.encode(PROMPT)
    for _ in range(steps):
        ids.append(model.draw(ids, settings).chosen)
    return ids[len(PROMPT) :]


def greedy_ids(steps: int) -> list[int]:
    """The tiny model's own greedy continuation of the whole backend's prompt (transformers' generate())."""
    loaded = tiny_model("llama")
    ids = loaded.tokenizer(PROMPTS["whole"], return_tensors="pt").input_ids
    made = loaded.model.generate(ids, max_new_tokens=steps, do_sample=False, pad_token_id=0)
    return made[0, ids.shape[1] :].tolist()


def greedy_text(backend: str, steps: int) -> str:
    """What each backend's model itself continues its prompt with, greedily (outside tokenviz)."""
    if backend == "fixed":
        return "".join(chr(ord(PROMPT[-1]) + i) for i in range(1, steps + 1))
    if backend == "drawn":
        return DrawingFixed().decode(drawn_journey(steps, SamplingSettings(temperature=0)))
    return str(tiny_model("llama").tokenizer.decode(greedy_ids(steps)))


def trace(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = invoke(monkeypatch, capsys, "trace", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_trace_on_the_drawn_backend_gives_its_draws_and_its_top_5(ours, monkeypatch, capsys, temperature):
    args = ("--backend", "drawn", "--steps", "6", "--temperature", temperature, "--seed", "3")
    doc = trace(monkeypatch, capsys, PROMPT, *args)
    settings = SamplingSettings(temperature=float(temperature), seed=3)
    assert [s["chosen"]["id"] for s in doc["steps"]] == drawn_journey(6, settings)
    ids = DrawingFixed().encode(PROMPT)
    for step in doc["steps"]:
        top = torch.topk(logprobs_after(ids), TOP_N)
        assert [c["id"] for c in step["top"]] == top.indices.tolist()
        for candidate, logprob in zip(step["top"], top.values.tolist()):
            assert math.isclose(candidate["logprob"], logprob, abs_tol=TOLERANCE)
        ids.append(step["chosen"]["id"])
    assert doc["model"]["covers"] == TOP_N and doc["model"]["numbers_of"] == "its runtime"


def test_trace_on_the_whole_backend_is_the_models_own_with_its_lens_and_attention(ours, monkeypatch, capsys):
    doc = trace(monkeypatch, capsys, PROMPTS["whole"], "--backend", "whole", "--steps", "4", "--temperature", "0",
                "--lens", "--attention", "0")  # fmt: skip
    assert [s["chosen"]["id"] for s in doc["steps"]] == greedy_ids(4)
    assert doc["model"]["runtime"].startswith("the whole runtime") and doc["model"]["name"] == "whole"
    for step in doc["steps"]:
        last = step["lens"][-1]  # (the last layer read through the head: the step's own distribution)
        assert last["top"][0]["id"] == step["top"][0]["id"]
        assert math.isclose(last["top"][0]["prob"], step["top"][0]["prob"], abs_tol=1e-5), (last, step["top"])
        for head in step["attention"]["heads"]:
            assert math.isclose(sum(head), 1.0, abs_tol=1e-5)


@pytest.mark.parametrize("backend", ["drawn", "whole"])
def test_score_is_each_models_own_log_probabilities(ours, monkeypatch, capsys, backend):
    text = "abcdxyz" if backend == "drawn" else "The cat sat on the mat."
    code, out, err = invoke(monkeypatch, capsys, "score", text, "--backend", backend, "--json")
    assert code == 0, err
    scored = json.loads(out)["tokens"]
    if backend == "drawn":
        ids = DrawingFixed().encode(text)
        rows = torch.stack([logprobs_after(ids[:position]) for position in range(1, len(ids))])
        within = TOLERANCE
    else:  # (a full recompute of the text in one pass, outside tokenviz)
        loaded = tiny_model("llama")
        ids = loaded.tokenizer(text).input_ids
        with torch.no_grad():
            rows = torch.log_softmax(loaded.model(torch.tensor([ids])).logits[0, :-1].double(), -1)
        within = RECOMPUTED
    assert [t["id"] for t in scored] == ids[1:]
    for position, token in enumerate(scored, 1):
        own = rows[position - 1]
        assert math.isclose(token["logprob"], float(own[ids[position]]), abs_tol=within), token
        assert token["rank"] == int((own > own[ids[position]]).sum()) + 1


def test_compare_puts_the_drawn_backend_beside_the_stepping_one(ours, monkeypatch, capsys):
    code, out, err = invoke(
        monkeypatch, capsys, "compare", PROMPT, "--backend", "fixed", "--against-backend", "drawn",
        "--steps", "4", "--temperature", "0", "--json",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["text"] == "defg"  # (the fixed model: the character after the last)
    assert [s["chosen"]["id"] for s in doc["b"]["steps"]] == drawn_journey(4, SamplingSettings(temperature=0))


def test_compare_on_the_whole_backend_runs_two_journeys_on_its_weights(ours, monkeypatch, capsys):
    code, out, err = invoke(
        monkeypatch, capsys, "compare", PROMPTS["whole"], "--backend", "whole", "--steps", "4",
        "--temperature", "0", "--against", "temperature=0.9", "--seed", "5", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert [s["chosen"]["id"] for s in json.loads(out)["a"]["steps"]] == greedy_ids(4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replay_verify_reproduces_a_journey_of_each_and_finds_an_edited_token(
    ours, monkeypatch, capsys, tmp_path, backend
):
    path = tmp_path / "journey.json"
    args = ("--backend", backend, "--steps", "5", "--temperature", "0.8", "--seed", "11", "--save", str(path))
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPTS[backend], *args)
    assert code == 0, err
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--backend", backend)
    assert code == 0 and out.startswith("verified: all 5 steps reproduce"), out + err
    saved = json.loads(path.read_text())
    decision = saved["replay"]["records"][2]["decision"]
    decision["chosen_id"] = (decision["chosen_id"] + 1) % 90
    path.write_text(json.dumps(saved))
    code, out, err = invoke(monkeypatch, capsys, "replay", str(path), "--verify", "--backend", backend)
    assert code == 1 and "mismatch: step 2 differs from the recording" in err, out + err


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_app_steps_on_each(ours, backend):
    from tokenviz.cli.backend_options import BackendChoice
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    settings = SamplingSettings(temperature=0)
    choice = BackendChoice("app", {"backend_name": backend}, frozenset({"backend_name"}))
    app = TokenvizApp(EngineWorker(choice.loader(settings), settings, PROMPTS[backend]))
    expected = PROMPTS[backend] + greedy_text(backend, 2)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        await wait_for(lambda: "".join(c.text for c in app.journey.snapshot.chips) == expected, pilot)


def installed(folder: Path) -> dict[str, str]:
    """The environment in which the tests' backends are a package's entry points (in `folder`, never in
    the test environment), as a plugin distribution would make them."""
    info = folder / "tokenviz_test_backends-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenviz-test-backends\nVersion: 1.0\n")
    points = "[tokenviz.backends]\n" + "".join(f"{name} = {name}_backend:BACKEND\n" for name in BACKENDS)
    (info / "entry_points.txt").write_text(points)
    return {"PYTHONPATH": os.pathsep.join([str(folder), str(TESTS), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.terminal
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_steps_in_a_real_terminal_at_80x24(tmp_path, backend):
    prompt = PROMPTS[backend]
    with terminal((80, 24), prompt, "--backend", backend, "--temperature", "0", env=installed(tmp_path)) as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        text = wait_screen(name, r"step 2 · \d+ tokens")
        assert prompt + greedy_text(backend, 2) in text.replace("\n", ""), text
        quits_cleanly(name)


@pytest.mark.terminal
@needs_browser
@pytest.mark.parametrize("backend", ["drawn", "whole"])
def test_serve_runs_each_in_a_browser_tab(tmp_path, backend):
    port = free_port()
    env = {**os.environ, **installed(tmp_path)}
    command = [sys.executable, "-m", "tokenviz", "serve", PROMPTS[backend], "--backend", backend, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        until(lambda: server.poll() is not None or socket.socket().connect_ex(("127.0.0.1", port)) == 0, 60, 0.2)
        assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
        with chromium() as browser:
            SEEN.clear()
            browser.get(f"http://127.0.0.1:{port}")
            until(lambda: "ready · step 0" in frames(browser), 120, 0.2)
            press(browser, " ")
            until(lambda: re.search(r"step 1 · \d+ tokens", frames(browser)) is not None, 120, 0.2)
    finally:
        server.terminate()
        server.wait(10)
