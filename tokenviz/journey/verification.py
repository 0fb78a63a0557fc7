"""Check the KV cache: redo the latest cached step and compare it with a full recompute."""

from __future__ import annotations

import torch

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Verification
from tokenviz.model.runner import ModelRunner
from tokenviz.model.transfer import to_host


def verify_latest(runner: ModelRunner, ids: list[int]) -> Verification:
    """Redo the latest cached step in float32 and compare it with a full forward without the cache.

    `ids` are the tokens the cache holds. The cache is cropped by one position and the same token
    fed again, which leaves it as it was.
    """
    fed = len(ids)
    if not fed:
        raise TokenvizError("nothing to verify yet")
    runner.crop(fed - 1)
    cached = runner.forward([ids[-1]], attention_dtype=torch.float32)
    full = runner.recompute(ids)
    host = to_host(
        {
            "logit_diff": (full.logits.float() - cached.logits.float()).abs().max(),
            "attention_diff": (full.attention - cached.attention).abs().max(),
            "argmax_agrees": full.logits.argmax() == cached.logits.argmax(),
        }
    )
    return Verification(
        position=fed - 1,
        max_logit_diff=float(host["logit_diff"]),
        max_attention_diff=float(host["attention_diff"]),
        argmax_agrees=bool(host["argmax_agrees"]),
    )
