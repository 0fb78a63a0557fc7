"""The bundled SmolLM2-135M against transformers itself: generate(), and a full recompute."""

import pytest
import torch
from tiny import eager_forward

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

pytestmark = pytest.mark.bundled
PROMPT = "The Eiffel Tower is located in"


def test_greedy_matches_generate_token_for_token(bundled):
    s = Session(ModelRunner(bundled), SamplingSettings(temperature=0, max_new_tokens=20))
    s.start(PROMPT)
    while s.step() is not None:
        pass
    ids = bundled.tokenizer(PROMPT, return_tensors="pt").input_ids.to(bundled.model.device)
    with torch.inference_mode():
        out = bundled.model.generate(ids, do_sample=False, max_new_tokens=20)
    assert len(s.generated_ids) == 20
    assert s.generated_ids == out[0, ids.shape[1] :].tolist()


def test_cached_logits_and_attention_equal_full_forward(bundled):
    s = Session(ModelRunner(bundled), SamplingSettings(temperature=0.8, seed=7))
    s.start(PROMPT)
    for _ in range(30):
        s.step()
    out = eager_forward(bundled.model, s.ids)
    assert torch.allclose(s._pending_logits, out.logits[0, -1], atol=1e-4)
    n = len(s.ids)
    shown = s.attention(range(n), range(bundled.info.layers))  # every row the pane can show, prompt included
    for layer, full in enumerate(out.attentions):
        assert abs(shown[layer] - full[0].cpu().numpy()).max() < 1e-4
    s.rewind(1)
    s.runner.crop(len(s.ids) - 1)
    fresh = s.runner.forward([s.ids[-1]])
    out = eager_forward(bundled.model, s.ids)
    assert torch.allclose(fresh.logits, out.logits[0, -1], atol=1e-4)


def test_sampled_journey_reproduces_with_the_same_seed(bundled):
    def run(seed):
        s = Session(ModelRunner(bundled), SamplingSettings(temperature=1.0, seed=seed, max_new_tokens=8))
        s.start(PROMPT)
        while s.step() is not None:
            pass
        return s.generated_ids

    assert run(5) == run(5)
    assert run(5) != run(6)
