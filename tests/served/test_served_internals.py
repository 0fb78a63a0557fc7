"""Inside a served model: the lens and attention rows of the model a real vLLM server with the vllm-lens
plugin runs (tests/served/conftest.py), held to transformers' own numbers on the same model; a plain
server and a server whose activations lie are one line each."""

from __future__ import annotations

import base64
import json
import pickle

import numpy as np
import pytest
import zstandard
from clitools import invoke
from hostile_server import hostile_server, proxying
from terminals import keys, pane_text, quits_cleanly, terminal, wait_gone, wait_screen, wait_toast

from tokenviz.contract.results import LensAsk

pytestmark = pytest.mark.served

PROMPT = "The Eiffel Tower is located in"
KEY_ENV = "TOKENVIZ_TEST_SERVER_KEY"
LAYER = 20
LENS_TOLERANCE = 1e-3  # a probability, the served lens against transformers' (float32 both)
ATTENTION_TOLERANCE = 1e-4  # a weight, the served rows against transformers' eager attention


def served(server, monkeypatch, *more: str) -> list[str]:
    monkeypatch.setenv(KEY_ENV, server.key)
    return ["--endpoint", server.url, "--api-key-env", KEY_ENV, *more]


def one_error(code: int, err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.mark.bundled
def test_the_served_lens_and_attention_rows_are_transformers_own(monkeypatch, capsys, vllm_lens_server):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    options = ["--steps", "6", "--temperature", "0", "--lens", "--attention", str(LAYER), "--json"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, *options)
    assert code == 0, err
    doc = json.loads(out)
    directory = str(vllm_lens_server.model)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    prompt = AutoTokenizer.from_pretrained(directory)(PROMPT, return_tensors="pt")["input_ids"]
    greedy = model.generate(prompt, max_new_tokens=6, do_sample=False)[0].tolist()
    chosen = [s["chosen"]["id"] for s in doc["steps"]]
    assert chosen == greedy[prompt.shape[1] :]
    with torch.no_grad():
        out = model(torch.tensor([greedy[:-1]]), output_hidden_states=True, output_attentions=True)
    layers = model.config.num_hidden_layers
    for i, step in enumerate(doc["steps"]):
        position = prompt.shape[1] - 1 + i
        assert len(step["lens"]) == layers + 1
        for row in step["lens"]:
            layer = row["layer"]
            if layer < layers:  # (transformers' last hidden state is after the final norm: its logits)
                with torch.no_grad():
                    logits = model.lm_head(model.model.norm(out.hidden_states[layer][0, position]))
            else:
                logits = out.logits[0, position]
            probs = torch.softmax(logits, -1)
            assert row["top"][0]["id"] == int(probs.argmax()), (i, layer)
            assert abs(row["chosen_prob"] - float(probs[chosen[i]])) < LENS_TOLERANCE, (i, layer)
        theirs = out.attentions[LAYER][0, :, position, : position + 1]
        mine = torch.tensor(step["attention"]["heads"])
        assert step["attention"]["layer"] == LAYER and mine.shape == theirs.shape
        assert (mine - theirs).abs().max() < ATTENTION_TOLERANCE


def test_while_the_lens_is_in_use_a_step_brings_its_stream_and_the_lens_asks_nothing_more(
    vllm_lens_server, monkeypatch
):
    """Cost follows what is on screen: once the lens is asked for, each step's one request also brings
    the residual stream, and the lens at the new position is read from it (no request of its own), equal
    to the lens a request of its own gives; once the lens is no longer asked for, steps ask for no stream."""
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.shared.endpoint import ApiKey
    from tokenviz.contract.engine import Caching
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    monkeypatch.setenv(KEY_ENV, vllm_lens_server.key)
    choice = ServedChoice(vllm_lens_server.url, api_key=ApiKey(env=KEY_ENV))
    engine = ServedEngine.open(choice, str(vllm_lens_server.model))
    assert engine.internals is not None and not isinstance(engine, Caching)  # the lens with no cache here
    given = (
        "step",
        "attention rows",
        "logit lens",
        "leave-one-out",
        "interventions",
        "local tokenizer",
        "residual stream",
    )
    assert engine.info.capabilities == given  # (its tokenizer here: no head ablation, no grammar stage)
    session = Session(engine, SamplingSettings(temperature=0, max_new_tokens=100))
    session.start(PROMPT)
    session.analyses.inspect(len(session.ids) - 1)  # (the lens asked for: from the next step on, in its request)
    for _ in range(3):
        before = engine.endpoint.requests
        session.step()
        position = len(session.ids) - 1
        shown = session.analyses.inspect(position)
        assert engine.endpoint.requests - before == 1  # the step's one request carried the stream
        assert engine.internals.captured is not None
        engine.internals.captured = None  # the same lens from a request of its own
        alone = engine.inspect(LensAsk(tuple(session.ids), (position,), (shown.chosen_id,)))[0]
        assert engine.endpoint.requests - before == 2
        for a, b in zip(shown.lens, alone.lens, strict=True):
            assert [t[0] for t in a.top] == [t[0] for t in b.top]
            assert abs(a.chosen_prob - b.chosen_prob) < 1e-5 and abs(a.residual_norm - b.residual_norm) < 1e-3
    session.step()  # (the lens asked for since the last step: this one still brings the stream)
    session.step()
    assert engine.internals.captured is None  # the lens not asked for: no stream asked


def test_a_plain_server_or_no_model_directory_refuses_the_lens_in_one_line(
    monkeypatch, capsys, vllm_server, vllm_lens_server
):
    plain = served(vllm_server, monkeypatch, "--tokenizer", str(vllm_server.model))
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *plain, "--lens", "--steps", "1")[::2])
    assert "no vllm-lens plugin" in line and "pip install --no-deps --ignore-requires-python vllm-lens" in line
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *plain, "--attention", "3")[::2])
    assert "--attention needs the engine's attention rows" in line and "vllm-lens" in line
    bare = served(vllm_lens_server, monkeypatch)
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *bare, "--lens", "--steps", "1")[::2])
    assert "give --tokenizer DIR" in line
    with_dir = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *with_dir, "--attention", "30")[::2])
    assert "layers are 0 to 29" in line


class Boom:
    """What a hostile server's pickle would build: a file written the moment it is unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _lie(kind: str, marker: str):
    def tamper(answer: dict) -> None:
        activations = answer.get("activations")
        if not activations:
            return
        stream = activations["residual_stream"]
        if kind == "pickle":
            evil = base64.b64encode(pickle.dumps(Boom(marker))).decode()
            activations["residual_stream"] = {"__type__": "cloudpickle", "data": evil}
        elif kind == "shape":
            stream["shape"] = [stream["shape"][0], stream["shape"][1], 577]
        elif kind == "bomb":  # a small frame that inflates far past the shape it claims
            stream["data"] = base64.b64encode(zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))).decode()

    return tamper


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("pickle", "in a form tokenviz does not read"),
        ("shape", "of shape [30, 7, 577], where the model's is 30×7×576"),
        ("bomb", "where its shape says"),
    ],
)
def test_activations_that_carry_a_pickle_or_lie_are_one_line_and_nothing_is_unpickled(
    monkeypatch, capsys, vllm_lens_server, tmp_path, kind, said
):
    marker = tmp_path / "unpickled"
    with hostile_server() as server:
        proxying(server, vllm_lens_server.url, vllm_lens_server.key, _lie(kind, str(marker)))
        args = ["--endpoint", server.url, "--tokenizer", str(vllm_lens_server.model)]
        code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, "--lens", "--steps", "1", "--json")
    assert said in one_error(code, err) and out == ""
    assert not marker.exists()


@pytest.mark.terminal
def test_the_app_shows_a_served_models_lens_and_attention_at_80x24(vllm_lens_server):
    args = ["--endpoint", vllm_lens_server.url, "--api-key-env", KEY_ENV, "--tokenizer", str(vllm_lens_server.model)]
    with terminal((80, 24), *args, "--temperature", "0", env={KEY_ENV: vllm_lens_server.key}) as name:
        shown = wait_screen(name, r"·in@6 attends to: The 0\.\d+", timeout=180)  # (from the server's Q and K)
        assert "served at 127.0.0.1" in shown and "L29 of 30" in shown
        keys(name, "space")
        wait_screen(name, r"1 generated")
        keys(name, "l")
        lens = wait_screen(name, r"top-1 from L\d+")
        assert "logit lens" in lens and "emb ·the" in lens and "needs the engine" not in lens
        keys(name, "I")
        wait_screen(name, r"Enter applies")
        keys(name, "steer-tokens 15:8: Paris: the", "Enter")
        steered = wait_screen(name, r"KL ≥ \d\.\d{3}", timeout=120)  # (the model's own beside it: a floor)
        assert "steer L15" in steered or "1 intervention" in steered, steered
        quits_cleanly(name)


@pytest.mark.terminal
def test_a_served_model_with_its_tokenizer_has_it_and_a_grammar_says_the_server_draws(vllm_lens_server):
    """Issue 69, finding 3, at 200x60: with --tokenizer DIR, G answered that the served model lacked the
    local tokenizer and M listed it under "not"; it has it, and a grammar needs tokenviz to draw."""
    args = ["--endpoint", vllm_lens_server.url, "--api-key-env", KEY_ENV, "--tokenizer", str(vllm_lens_server.model)]
    with terminal((200, 60), *args, "--temperature", "0", env={KEY_ENV: vllm_lens_server.key}) as name:
        wait_screen(name, r"ready · step 0", timeout=180)
        keys(name, "G")
        said = wait_toast(name, "the server draws each token itself")
        assert "needs the local tokenizer" not in said
        keys(name, "M")
        model = pane_text(wait_screen(name, r"not: "), "─ model ")  # (the view's lines joined)
        can, _, cannot = model.partition("not: ")
        assert "local tokenizer" in can.rpartition("can: ")[2] and "grammar stage" in cannot, model
        keys(name, "Escape", "h", "h", "z")  # (finding 22: said before "choose one head with h first")
        wait_toast(name, "a head cannot be ablated inside a server")
        keys(name, "I")  # (and the dialog's example is one a server takes)
        wait_screen(name, r"steer-tokens 5:8: Paris: the")
        keys(name, "Escape")
        # q typed while the dialog still closes went to its field on a loaded machine (CI, 2026-12-02)
        wait_gone(name, "steer-tokens 5:8: Paris: the")
        quits_cleanly(name)


@pytest.mark.bundled
def test_the_served_lens_of_a_600_token_prompt_gives_every_layer_at_each_step(monkeypatch, capsys, vllm_lens_server):
    """(Round 6, finding 2: past about 400 tokens the capture passed a fixed 32 MB bound on an answer:
    "answered with more than 32 MB: refused", exit 2, no step.) The bound is now what the request asks
    (layers × positions × hidden × 4 bytes, as sent), and the whole context's capture fits its budget."""
    from tokenviz.backends.served.internals import CAPTURE_BUDGET_BYTES, FLOAT_BYTES

    prompt = " ".join(["The Eiffel Tower is located in Paris, the capital of France."] * 46)
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    code, out, err = invoke(monkeypatch, capsys, "trace", prompt, *args, "--lens", "--steps", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    positions = len(doc["prompt"])
    assert positions >= 600, positions
    layers = doc["model"]["layers"]
    assert len(doc["steps"]) == 2 and all(len(step["lens"]) == layers + 1 for step in doc["steps"])
    per_position = layers * doc["model"]["hidden"] * FLOAT_BYTES  # (30 × 576 × 4: 69,120 bytes raw)
    assert per_position * (positions + 2) < CAPTURE_BUDGET_BYTES


@pytest.mark.bundled
def test_the_bench_measures_the_lens_as_the_80x24_view_asks_it(monkeypatch, vllm_lens_server):
    """The bench's served lens measure steps the app's path with the lens view's rows at 80x24 (5 of 31,
    spread over the depth), every row beside, and reports its figures (no time asserted)."""
    from bench import budgets
    from bench import served as served_measures
    from bench.anchors import LENS_VIEW_ROOM
    from tokenviz.backends.shared.endpoint import ApiKey

    monkeypatch.setenv(KEY_ENV, vllm_lens_server.key)
    result = served_measures.served_lens(
        vllm_lens_server.url, ApiKey(env=KEY_ENV), str(vllm_lens_server.model), tokens=2
    )
    assert result["lens_rows"] == LENS_VIEW_ROOM
    assert result["ratio"] == pytest.approx(result["step_with_lens_ms"] / result["step_ms"])
    assert result["every_row_ratio"] == pytest.approx(result["step_with_every_row_ms"] / result["step_ms"])
    assert budgets.verdicts({"served_lens": result})["served_lens_step"]["value"] == result["ratio"]


def test_the_served_lens_asks_its_server_only_for_the_layers_shown(monkeypatch, capsys, vllm_lens_server):
    """(Round 6, finding 2: the capture asked for every layer whatever the view showed.) With --lens-layers
    every request asks the server for those layers (and the last, which the head is checked on) alone, and
    each row equals the same row of the whole lens."""
    from tokenviz.backends.shared.endpoint import Endpoint

    asked: list[list[int]] = []
    post = Endpoint.post

    def noted(self, path, body, *more, **kwargs):
        stream = body.get("vllm_xargs", {}).get("output_residual_stream")
        if stream is not None:
            asked.append(list(stream))
        return post(self, path, body, *more, **kwargs)

    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    options = ["--steps", "3", "--temperature", "0", "--json"]
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, *options, "--lens")
    assert code == 0, err
    whole = json.loads(out)
    layers = whole["model"]["layers"]
    monkeypatch.setattr(Endpoint, "post", noted)
    code, out, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, *options, "--lens-layers", "emb,3,12")
    assert code == 0, err
    assert asked and all(stream == [3, 12, layers - 1] for stream in asked[1:]), asked  # (the probe asks layer 0)
    for full, part in zip(whole["steps"], json.loads(out)["steps"]):
        assert [row["layer"] for row in part["lens"]] == [0, 4, 13]
        for row in part["lens"]:
            assert row["chosen_prob"] == pytest.approx(full["lens"][row["layer"]]["chosen_prob"], abs=LENS_TOLERANCE)


@pytest.mark.bundled
def test_replay_verify_holds_a_served_journeys_lens_and_attention_rows_to_the_server(
    monkeypatch, capsys, vllm_lens_server, tmp_path
):
    """(Round 6, finding 1: a journey whose lens rows were altered was "verified".) A served trace saved with
    its lens and an attention row verifies against the server; a lens row 0.01 off, or an attention weight
    0.001 off, is a mismatch naming its place; and so are a kept attention row (every layer's, as the file
    keeps them) and an attribution the journey holds, each made again at its place and compared."""
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    saved = tmp_path / "lens.json"
    options = ["--steps", "3", "--temperature", "0", "--lens", "--attention", "5", "--save", str(saved)]
    options += ["--lens-layers", "emb,0-29/3,last", "--attribution", "loo"]
    code, _, err = invoke(monkeypatch, capsys, "trace", PROMPT, *args, *options)
    assert code == 0, err
    code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *args)
    assert code == 0 and "verified: all 3 steps" in out, err
    original = json.loads(saved.read_text())
    kept = [i for i, r in enumerate(original["replay"]["records"]) if r["attention"] is not None]
    assert kept and original["replay"]["attributions"], "the file keeps attention rows and the attribution"
    for place, change in (("lens", 0.01), ("attention", 1e-3), ("kept row", 0.01), ("attribution", 0.01)):
        doc = json.loads(json.dumps(original))
        if place == "lens":
            doc["step_views"][1]["lens"][3]["chosen_prob"] += change
            where = "step_views[1].lens[3].chosen_prob"
        elif place == "attention":
            doc["step_views"][2]["attention"]["heads"][3][4] += change
            where = "step_views[2].attention.heads[3][4]"
        elif place == "kept row":
            record = doc["replay"]["records"][kept[-1]]["attention"]
            weights = np.frombuffer(base64.b64decode(record["float16"]), dtype=np.float16).copy()
            weights[weights.argmax()] -= change
            record["float16"] = base64.b64encode(weights.tobytes()).decode()
            where = f"replay.records[{kept[-1]}].attention.float16["
        else:
            doc["replay"]["attributions"][0]["scores"][1] += change
            where = "replay.attributions[0].scores[1]"
        saved.write_text(json.dumps(doc))
        code, out, err = invoke(monkeypatch, capsys, "replay", str(saved), "--verify", *args)
        assert code == 1 and f"mismatch: {where}" in err, (place, out, err)
