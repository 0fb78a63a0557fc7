"""Check the KV cache: redo the latest cached step and compare it with a full recompute."""

from __future__ import annotations

from collections.abc import Callable

from tokenviz.contract.engine import AttentionRows, Caching, Capability, Engine, require, scores_of
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import Verification
from tokenviz.journey import memory_policy
from tokenviz.tensors.transfer import to_host


def verify_latest(
    runner: Engine,
    ids: list[int],
    progress: Callable[[int, int], None] = lambda done, total: None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Verification:
    """Redo the latest cached step and compare it, and the attention row computed for the view,
    with the whole context run again independent of the journey's cache, as the engine recomputes it
    (its recomputed_as; in chunks of the prefill's size, with `progress`; `cancelled()` ends it
    between them).

    `ids` are the tokens the cache holds. The cache is cropped by one position and the same token
    fed again, which leaves it as it was.
    """
    fed = len(ids)
    if not fed:
        raise TokenvizError("nothing to verify yet")
    cache: Caching = require(runner, Capability.CACHE, "verify")
    attention: AttentionRows = require(runner, Capability.ATTENTION, "verify")
    runner.crop(fed - 1)
    cached = scores_of(runner.forward([ids[-1]]))
    rows = attention.attention(ids, range(fed - 1, fed), range(runner.info.layers))[:, :, 0]
    logits, full_rows = cache.recompute(ids, memory_policy.PREFILL_CHUNK, progress, cancelled)
    host = to_host(
        {
            "logit_diff": (logits.float() - cached.float()).abs().max(),
            "attention_diff": (full_rows - rows).abs().max(),
            "argmax_agrees": logits.argmax() == cached.argmax(),
        }
    )
    return Verification(
        position=fed - 1,
        max_logit_diff=float(host["logit_diff"]),
        max_attention_diff=float(host["attention_diff"]),
        argmax_agrees=bool(host["argmax_agrees"]),
        compared_with=cache.recomputed_as,
    )
