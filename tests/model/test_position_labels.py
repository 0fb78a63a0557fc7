"""The model view's positions row, read from each family's config and modules, never guessed (UX 7's finding
10: a Gemma 3 model was said to have learned absolute positions; it is rotary, with one base for its sliding
layers and another for its full ones)."""

import pytest
from families import family_model

from tokenviz.backends.transformers.model_description import model_info

EXPECTED = {
    "gemma3_text": "rotary (base 10000 sliding attention, 1e+06 full attention)",
    "llama": "rotary (base 10000)",
    "mixtral": "rotary (base 1e+06)",
    "gpt2": "learned absolute (128 positions)",
    "opt": "learned absolute (130 positions)",  # (OPT's embedding keeps two more rows than its positions)
    "gptj": "rotary (the first 4 dimensions of each head)",
    "bloom": "ALiBi (linear biases by distance)",
    "mpt": "ALiBi (linear biases by distance)",
    "xglm": "sinusoidal absolute (fixed)",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_family_says_how_it_encodes_positions(kind):
    loaded = family_model(kind)
    assert model_info(loaded.model, "tiny", loaded.model.device, loaded.model.dtype).positions == EXPECTED[kind]
