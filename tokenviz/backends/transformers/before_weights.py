"""What a journey's settings ask of a model that its config and tokenizer alone can answer, checked
before the weights load (tokenviz.backends.transformers.loading.load_model's `before_weights`): a mistake then costs
seconds, not the minutes a large model takes to load.

- the interventions' layers, heads and number, against the config's figures;
- a patch's position, against its source text's tokens;
- the grammar, compiled for the tokenizer and followed a few tokens (the engine's limits, and a
  grammar that admits no text, are met there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenviz.backends.shared.parts import eos_id_set, layer_configs, text_config
from tokenviz.backends.transformers.loading import BeforeWeights
from tokenviz.contract.grammar import Grammar
from tokenviz.contract.interventions import Intervention, Patch, check_against, check_patch_source
from tokenviz.decoding.grammar import GrammarMatchers, hf_vocabulary


def journey_checks(grammar: Grammar | None = None, interventions: Sequence[Intervention] = ()) -> BeforeWeights:
    """The check of `grammar` and `interventions` against a model's config and tokenizer."""

    def check(config: Any, tokenizer: Any) -> None:
        text = text_config(config)
        if interventions:
            heads = layer_configs(text)[0].num_attention_heads  # as the model's info gives them: its first layer's
            check_against(tuple(interventions), text.num_hidden_layers, heads)
            for patch in (i for i in interventions if isinstance(i, Patch) and not i.source_ids):
                check_patch_source(patch, len(tokenizer(patch.source, add_special_tokens=True)["input_ids"]))
        if grammar is not None:
            eos_ids = eos_id_set(getattr(config, "eos_token_id", None), tokenizer)
            vocab = int(text.vocab_size)
            GrammarMatchers(hf_vocabulary(tokenizer, vocab, eos_ids), vocab, eos_ids).check(grammar)

    return check
