"""A drawn step's decision (a served model's): its numbers are the server's where no stage ran, never
a top-N renormalised as if it were the whole vocabulary."""

from __future__ import annotations

import math

import torch

from tokenviz.contract.results import Drawn
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.drawn import drawn_decision
from tokenviz.decoding.sampling import decide

VOCAB = 200


def served_top(logits: torch.Tensor, n: int = 20, raw: bool = True) -> Drawn:
    """What a server returns for these logits: the chosen (argmax) token and the top `n` log-probabilities."""
    logprobs = torch.log_softmax(logits.double(), -1)
    values, ids = torch.topk(logprobs, n)
    top = tuple((int(i), float(v)) for i, v in zip(ids, values))
    return Drawn(top[0][0], top[0][1], 1, top, raw, ms=1.0)


def test_a_greedy_served_step_has_the_whole_vocabularys_probability_as_the_local_decision_does():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    greedy = SamplingSettings(temperature=0)
    local = decide(logits, greedy, [1, 2], [], str)
    for raw in (True, False):  # (after the server's own stages, no stage runs here either)
        served = drawn_decision(served_top(logits, raw=raw), greedy, [1, 2], [], str, VOCAB)
        assert served.chosen_id == local.chosen_id and served.final_probs == local.final_probs
        assert math.isclose(served.chosen_prob, local.chosen_prob, rel_tol=1e-5)  # 20 of 200: not renormalised
        assert math.isclose(served.raw_prob, local.raw_prob, rel_tol=1e-5)
