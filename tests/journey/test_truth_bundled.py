"""The bundled SmolLM2-135M against transformers itself: generate() and a full recompute without the
cache, each by transformers' own model loaded afresh from the converted checkpoint (sdpa and eager),
never through tokenviz's attention, capture or mask (tests/stock.py)."""

import pytest
import torch
from stock import stock, stock_forward

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

pytestmark = pytest.mark.bundled
PROMPT = "The Eiffel Tower is located in"


def checkpoint() -> str:
    """The directory the bundled model was converted into: what transformers loads on its own."""
    from tokenviz.backends.transformers.gguf_cache import gguf_cache_dir
    from tokenviz.system.paths import bundled_gguf

    return str(gguf_cache_dir(bundled_gguf()))


def test_greedy_matches_generate_token_for_token(bundled):
    s = Session(ModelRunner(bundled), SamplingSettings(temperature=0, max_new_tokens=20))
    s.start(PROMPT)
    while s.step() is not None:
        pass
    device = str(bundled.model.device)
    ids = bundled.tokenizer(PROMPT, return_tensors="pt").input_ids.to(device)
    with torch.inference_mode():
        out = stock(checkpoint(), "sdpa", device).generate(ids, do_sample=False, max_new_tokens=20)
    assert len(s.generated_ids) == 20
    assert s.generated_ids == out[0, ids.shape[1] :].tolist()


def test_cached_logits_and_attention_equal_full_forward(bundled):
    s = Session(ModelRunner(bundled), SamplingSettings(temperature=0.8, seed=7))
    s.start(PROMPT)
    for _ in range(30):
        s.step()
    out = stock_forward(checkpoint(), s.ids, str(bundled.model.device))
    assert torch.allclose(s.pending_logits, out.logits[0, -1], atol=1e-4)
    n = len(s.ids)
    shown = s.attention(range(n), range(bundled.info.layers))  # every row the pane can show, prompt included
    for layer, full in enumerate(out.attentions):
        assert abs(shown[layer] - full[0].cpu().numpy()).max() < 1e-4
    s.rewind(1)
    s.engine.crop(len(s.ids) - 1)
    fresh = s.engine.forward([s.ids[-1]])
    out = stock_forward(checkpoint(), s.ids, str(bundled.model.device))
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
