"""An autoplay step gives way between two layers to a key that is waiting: the key is answered at
once, the step runs again after it, and nothing the set-aside step did remains."""

import threading

import pytest
import torch
from tiny import tiny_model

from tokenviz.backends.shared.parts import decoder_layers
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Adjust, Play
from tokenviz.contract.errors import GiveWay
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.worker.engine_thread import EngineWorker

PROMPT = "The cat sat on the mat."


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_step_set_aside_at_any_layer_leaves_the_journey_as_it_was(kind, where):
    def session() -> Session:
        s = Session(ModelRunner(tiny_model(kind)), SamplingSettings(temperature=0))
        s.start(s.engine.encode(PROMPT))
        s.step()
        return s

    plain, interrupted = session(), session()
    runner = interrupted.engine
    before = [(cached.keys.clone(), cached.values.clone()) for cached in runner.cache.layers]
    ids, pending = list(interrupted.ids), interrupted.pending
    layer = 0 if where == "first" else len(decoder_layers(runner.model)) - 1

    asked = []

    def give_way() -> bool:
        asked.append(True)
        return len(asked) > layer  # before layer `layer` runs

    with pytest.raises(GiveWay):
        interrupted.step(give_way=give_way)
    assert interrupted.ids == ids and interrupted.pending == pending
    for cached, (keys, values) in zip(runner.cache.layers, before):
        assert torch.equal(cached.keys, keys) and torch.equal(cached.values, values)

    layers = list(range(len(runner.cache.layers)))
    for _ in range(3):  # and the journey goes on as if nothing had happened
        a, b = plain.step(), interrupted.step()
        assert a.decision.chosen_id == b.decision.chosen_id
        torch.testing.assert_close(
            plain.engine.attention(plain.ids, range(len(plain.ids) - 1, len(plain.ids)), layers),
            runner.attention(interrupted.ids, range(len(interrupted.ids) - 1, len(interrupted.ids)), layers),
        )
    assert plain.ids == interrupted.ids


class Gate:
    """Holds the model before its second layer until opened: a step in progress, on purpose."""

    def __init__(self):
        self.inside, self.open = threading.Event(), threading.Event()

    def __call__(self, module, args):
        if not self.open.is_set():
            self.inside.set()
            self.open.wait(10)


def test_a_key_pressed_during_an_autoplay_step_is_answered_before_the_step_ends():
    from test_engine_worker import Collector, scored

    gate = Gate()

    def load(progress):
        loaded = tiny_model("llama")
        decoder_layers(loaded.model)[1].register_forward_pre_hook(gate)
        return ModelRunner(loaded)

    gate.open.set()  # loading and the prefill pass freely
    post = Collector()
    worker = EngineWorker(load, SamplingSettings(temperature=0, max_new_tokens=6), PROMPT)
    worker.start(post)
    try:
        # Ready, and the prompt's predictions made (Session.score_prompt, run while the engine is idle after
        # the prefill): on a busy machine their passes were still running, and the gate held one of them.
        ready = post.wait(lambda s: scored(s) and s.message == "")
        gate.open.clear()
        worker.submit(Play())
        assert gate.inside.wait(10)  # a step is in its second layer, held there
        worker.submit(Adjust(name="top_k", direction=1))
        gate.open.set()  # the step goes on to its next layer boundary, where the key is waiting
        answered = post.wait(lambda s: s.handled == 2)
        assert answered.settings.top_k != ready.settings.top_k
        done = post.wait(lambda s: not s.playing and s.handled == 2)
        # The held step was set aside, not finished first: the token it was taking was decided again
        # under the key's setting before it was taken. (Read from the records, not from the first frame
        # after the key: during autoplay a frame may wait for the next step.)
        taken = done.records[len(ready.records) - 1]
        assert taken.decision.settings.top_k == answered.settings.top_k, taken.decision.settings
    finally:
        gate.open.set()
        worker.stop()
    # The journey is the one transformers' greedy generate() gives.
    loaded = tiny_model("llama")
    ids = loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    expected = loaded.model.generate(ids, max_new_tokens=6, do_sample=False)[0].tolist()
    assert [chip.id for chip in done.chips] == expected[: len(done.chips)] and len(done.chips) > len(ready.chips)


def test_a_step_asks_before_a_few_layers_spread_through_it_not_every_one():
    """Each hook costs the step its call: a step asks whether a key waits CANCEL_POINTS times."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tokenviz.backends.transformers.interrupt import layer_by_layer
    from tokenviz.backends.transformers.runner import CANCEL_POINTS

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    asked: list[int] = []
    with torch.inference_mode(), layer_by_layer(model, lambda: False, lambda i, n: asked.append(i), points=4):
        model(torch.tensor([[1, 2, 3]]))
    assert asked == [0, 8, 16, 24] and CANCEL_POINTS == 4
    with torch.inference_mode(), layer_by_layer(model, lambda: False, lambda i, n: asked.append(i)):
        model(torch.tensor([[1, 2, 3]]))
    assert asked[4:] == list(range(30))  # (a cancel asks before every layer)
