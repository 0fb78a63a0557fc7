"""Steering a served model: --steer, --steer-tokens and --patch sent to a real vLLM server with the
vllm-lens plugin as steering vectors (tests/served/conftest.py), held to the same additions made in
transformers itself and to tokenviz's local steered trace; the model's own distribution beside them is
the plain model's, even after a steered request went over the same prompt (vLLM's prefix cache); a head
ablation and a server without the plugin are one line each."""

from __future__ import annotations

import json

import pytest
from clitools import invoke
from test_served_internals import KEY_ENV, PROMPT, one_error, served

pytestmark = [pytest.mark.served, pytest.mark.bundled]

STEPS = 6
PROB_TOLERANCE = 1e-4  # a probability, the served steered step against transformers' (float32 both)
# A prompt longer than a few of vLLM's KV blocks: its blocks are kept in the prefix cache and read again.
LONG = (
    "The history of the city of Paris goes back a long way, and its monuments are known around the world; " * 12
) + ("the Eiffel Tower is located in")


@pytest.fixture(scope="module")
def reference(vllm_lens_server):
    """The served model's directory in transformers (float32), and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = str(vllm_lens_server.model)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(directory)


def steered_greedy(model, ids: list[int], steps: int, add):
    """Greedy tokens after `ids` with `add(layer_output, start)` changing decoder layers' outputs (a full
    pass each step, no cache), and each step's probabilities."""
    import torch

    tokens, probs = list(ids), []
    for _ in range(steps):
        with torch.no_grad(), add():
            logits = model(torch.tensor([tokens])).logits[0, -1]
        p = torch.softmax(logits.double(), -1)
        probs.append(p)
        tokens.append(int(p.argmax()))
    return tokens[len(ids) :], probs


def layer_hook(model, layer: int, change):
    """A context adding a forward hook on decoder layer `layer` whose output `change(hidden)` replaces."""
    from contextlib import contextmanager

    @contextmanager
    def hooked():
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            changed = change(hidden.clone())
            return (changed, *output[1:]) if isinstance(output, tuple) else changed

        handle = model.model.layers[layer].register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    return hooked


def trace_json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = invoke(monkeypatch, capsys, "trace", *args)
    assert code == 0, err
    return json.loads(out)


def assert_steps_match(doc: dict, tokens: list[int], probs) -> None:
    assert [s["chosen"]["id"] for s in doc["steps"]] == tokens
    for step, p in zip(doc["steps"], probs):
        assert step["unsteered"]["kl_floor"] is True and step["unsteered"]["kl"] >= 0
        for candidate in step["top"]:
            assert abs(candidate["prob"] - float(p[candidate["id"]])) < PROB_TOLERANCE, (step["index"], candidate)


def test_steering_by_tokens_is_transformers_own_and_the_local_traces(monkeypatch, capsys, vllm_lens_server, reference):
    """The issue's done-when: --steer-tokens '15:8: Paris: the' on the served model gives the tokens of the
    same addition in transformers and of tokenviz's local steered trace, with the model's own beside them."""
    model, tokenizer = reference
    spec = "15:8: Paris: the"
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    options = ["--steps", str(STEPS), "--temperature", "0", "--steer-tokens", spec, "--json"]
    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options)
    ids = tokenizer(PROMPT)["input_ids"]
    rows = model.lm_head.weight
    paris, the = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Paris", " the"))
    direction = 8.0 * (rows[paris] - rows[the]).detach()
    tokens, probs = steered_greedy(model, ids, STEPS, layer_hook(model, 15, lambda h: h + direction))
    assert_steps_match(doc, tokens, probs)
    assert tokenizer.decode(tokens).startswith(" Paris")  # (the steering shows: unsteered, " the" is likelier)
    own = steered_greedy(model, ids, 1, layer_hook(model, 15, lambda h: h))[1][0]
    for candidate in doc["steps"][0]["unsteered"]["top"]:
        assert abs(candidate["prob"] - float(own[candidate["id"]])) < PROB_TOLERANCE
    local = trace_json(monkeypatch, capsys, PROMPT, "--dtype", "float32", *options)
    assert [s["chosen"]["id"] for s in local["steps"]] == tokens
    assert local["steps"][0]["unsteered"]["kl"] >= doc["steps"][0]["unsteered"]["kl"]  # (a floor: at most the KL)


def test_steering_by_texts_and_a_patch_are_transformers_own(monkeypatch, capsys, vllm_lens_server, reference):
    import torch

    model, tokenizer = reference
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    ids = tokenizer(PROMPT)["input_ids"]

    def residual(text: str, layer: int, position: int = -1):
        with torch.no_grad():
            states = model(torch.tensor([tokenizer(text)["input_ids"]]), output_hidden_states=True).hidden_states
        return states[layer + 1][0, position]

    direction = 4.0 * (residual("Love", 8) - residual("Hate", 8))
    options = ["--steps", "3", "--temperature", "0", "--json"]
    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options, "--steer", "8:4:Love:Hate")
    assert_steps_match(doc, *steered_greedy(model, ids, 3, layer_hook(model, 8, lambda h: h + direction)))

    source = residual("The dog sat on the mat", 10, 3)

    def patched(hidden):
        if hidden.shape[1] > 3:  # (a full pass each step: position 3 is always in it)
            hidden[0, 3] = source
        return hidden

    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options, "--patch", "10:3:The dog sat on the mat")
    assert_steps_match(doc, *steered_greedy(model, ids, 3, layer_hook(model, 10, patched)))


def test_the_models_own_distribution_is_never_read_from_steered_cache_blocks(vllm_lens_server, reference, monkeypatch):
    """vLLM keeps the blocks a steered request computed in its prefix cache; a plain request over the same
    long prompt would read them (its 'own' distribution steered) unless the steered one is salted apart."""
    import torch

    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.shared.endpoint import ApiKey
    from tokenviz.contract.interventions import parse_steering
    from tokenviz.contract.settings import SamplingSettings

    model, tokenizer = reference
    monkeypatch.setenv(KEY_ENV, vllm_lens_server.key)
    endpoint = ServedChoice(vllm_lens_server.url, api_key=ApiKey(env=KEY_ENV)).connect()
    engine = ServedEngine(endpoint, "smollm2", local_tokenizer=tokenizer, model_files=str(vllm_lens_server.model))
    engine.raw = True  # (known: measuring it would send plain requests over these tokens first)
    ids = tokenizer(LONG)["input_ids"]
    assert len(ids) > 256
    steer = parse_steering("15:8: Paris: the", by="tokens")
    steering = engine.intervene([steer], ids, lambda text: tokenizer(text, add_special_tokens=False)["input_ids"][0])
    drawn = engine.draw(ids, SamplingSettings(temperature=0.0))  # the first request over these tokens: steered
    own, _ = steering.own_logits(ids)  # then the plain one
    with torch.no_grad():
        plain = torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)
    for token, logprob in own.top:
        assert abs(float(torch.tensor(logprob).exp()) - float(plain[token])) < PROB_TOLERANCE, token
    assert dict(drawn.top) != dict(own.top)  # (the steering changed the distribution: the test can tell)


def test_a_head_ablation_or_a_server_without_the_plugin_is_one_line(monkeypatch, capsys, vllm_server, vllm_lens_server):
    lens = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *lens, "--ablate", "3.1", "--steps", "1")[::2])
    assert "cannot be ablated" in line and "code" in line
    plain = served(vllm_server, monkeypatch, "--tokenizer", str(vllm_server.model))
    options = ("--steer-tokens", "15:8: Paris: the", "--steps", "1")
    line = one_error(*invoke(monkeypatch, capsys, "trace", PROMPT, *plain, *options)[::2])
    assert "interventions" in line and "pip install --no-deps --ignore-requires-python vllm-lens" in line


def test_a_served_journey_steered_midway_redecides_its_pending_token(vllm_lens_server, reference, monkeypatch):
    """The app's way (I, Y, J): interventions set while a served journey runs re-decide the pending token
    at once, with the model's own distribution beside it; cleared, the record is the model's again."""
    from tokenviz.backends.served.completions import ServedChoice
    from tokenviz.backends.served.engine import ServedEngine
    from tokenviz.backends.shared.endpoint import ApiKey
    from tokenviz.contract.interventions import parse_steering
    from tokenviz.contract.settings import SamplingSettings
    from tokenviz.journey.session import Session

    model, tokenizer = reference
    monkeypatch.setenv(KEY_ENV, vllm_lens_server.key)
    endpoint = ServedChoice(vllm_lens_server.url, api_key=ApiKey(env=KEY_ENV)).connect()
    engine = ServedEngine(endpoint, "smollm2", local_tokenizer=tokenizer, model_files=str(vllm_lens_server.model))
    session = Session(engine, SamplingSettings(temperature=0.0))
    session.start(PROMPT)
    session.step()
    own = session.records[-1]
    steer = parse_steering("15:8: Paris: the", by="tokens")
    session.set_interventions([steer])
    steered = session.records[-1]
    assert steered.interventions == (steer,) and steered.unsteered is not None and steered.unsteered.kl_floor
    assert [c.id for c in steered.unsteered.top] == [c.id for c in own.top]  # the same context, unsteered
    assert [c.id for c in steered.top] != [c.id for c in own.top]
    rows = model.lm_head.weight
    paris, the = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" Paris", " the"))
    direction = 8.0 * (rows[paris] - rows[the]).detach()
    context = list(session.ids)
    tokens, probs = steered_greedy(model, context, 1, layer_hook(model, 15, lambda h: h + direction))
    assert steered.decision.chosen_id == tokens[0]
    for candidate in steered.top:
        assert abs(candidate.prob - float(probs[0][candidate.id])) < PROB_TOLERANCE
    session.set_interventions([])
    again = session.records[-1]
    assert again.unsteered is None and again.interventions == ()
    assert [c.id for c in again.top] == [c.id for c in own.top]


def test_a_steered_served_journey_is_saved_and_verified_against_the_server(
    monkeypatch, capsys, vllm_lens_server, tmp_path
):
    journey = tmp_path / "steered.json"
    args = served(vllm_lens_server, monkeypatch, "--tokenizer", str(vllm_lens_server.model))
    options = ["--steps", "3", "--temperature", "0", "--steer-tokens", "15:8: Paris: the", "--save", str(journey)]
    doc = trace_json(monkeypatch, capsys, PROMPT, *args, *options, "--json")
    saved = json.loads(journey.read_text())
    assert doc["steps"][0]["unsteered"]["kl_floor"] is True and "kl_floor" in json.dumps(saved)
    code, out, err = invoke(monkeypatch, capsys, "replay", str(journey), "--verify", *args)
    assert code == 0 and "verified: all 3 steps" in out, out + err
    bare = served(vllm_lens_server, monkeypatch)  # (no directory: no head to steer by)
    line = one_error(*invoke(monkeypatch, capsys, "replay", str(journey), "--verify", *bare)[::2])
    assert "steer L15" in line and "--tokenizer DIR" in line
