"""What the model predicted at every prompt position, read from the prefill's logits.

The prefill computes a next-token distribution after each prompt token anyway; this keeps, per
position, the raw top candidates, the entropy, and how likely and how highly ranked the prompt's
own next token was (its surprisal) without holding the whole vocabulary for every position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from tokenviz.contract.records import Candidate, PromptPrediction
from tokenviz.model.transfer import ids_to_device

TOP = 5  # candidates kept per prompt position
KEYS = ("ids", "logits", "probs", "entropy", "next_prob", "next_rank", "next_logprob")


def predict_positions(
    position_logits: torch.Tensor, next_ids: Sequence[int], top: int = TOP
) -> dict[str, torch.Tensor]:
    """On the logits' device: for the first len(next_ids) positions, the raw top candidates, the
    entropy in bits, and the probability, 1-based rank and log-probability of `next_ids[i]` after
    position i. Worked through SLICE_NUMBERS scores at a time: a 2048-token prefill of a 128k
    vocabulary would otherwise hold about 4 GB of float32 temporaries at once."""
    logits = position_logits[: len(next_ids)]
    following = ids_to_device(next_ids, logits.device)[0]
    rows = max(1, SLICE_NUMBERS // logits.shape[-1])
    starts = range(0, len(next_ids), rows) or range(1)  # (no position: one empty slice)
    parts = [_predict(logits[i : i + rows], following[i : i + rows], top) for i in starts]
    return parts[0] if len(parts) == 1 else {key: torch.cat([part[key] for part in parts]) for key in KEYS}


SLICE_NUMBERS = 2**25  # scores per slice: 128 MB of float32


def _predict(position_logits: torch.Tensor, following: torch.Tensor, top: int) -> dict[str, torch.Tensor]:
    logits = position_logits.float()
    probs = torch.softmax(logits, -1)
    top_probs, top_ids = torch.topk(probs, min(top, probs.shape[-1]), -1)
    next_prob = probs.gather(1, following[:, None])[:, 0]
    return {
        "ids": top_ids,
        "logits": logits.gather(1, top_ids).double(),
        "probs": top_probs.double(),
        "entropy": (torch.special.entr(probs).sum(-1) / math.log(2)).double(),  # -p ln p, 0 where p is 0
        "next_prob": next_prob.double(),
        "next_rank": torch.gt(probs, next_prob[:, None]).sum(-1, dtype=torch.int32) + 1,  # int32: twice as fast
        "next_logprob": (logits.gather(1, following[:, None])[:, 0] - torch.logsumexp(logits, -1)).double(),
    }


def join(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The parts of consecutive chunks as one, keyed `prompt.<key>` for the step's transfer."""
    return {f"prompt.{key}": torch.cat([part[key] for part in parts]) for key in KEYS}


def read(
    host: dict[str, np.ndarray], prompt_ids: Sequence[int], piece: Callable[[int], str]
) -> tuple[PromptPrediction, ...]:
    """The predictions, from the host copies of `join`'s tensors."""
    ids, logits, probs = (host[f"prompt.{k}"].tolist() for k in ("ids", "logits", "probs"))
    entropy, next_prob, next_rank, next_logprob = (
        host[f"prompt.{k}"].tolist() for k in ("entropy", "next_prob", "next_rank", "next_logprob")
    )
    return tuple(
        PromptPrediction(
            position=p,
            top=tuple(
                Candidate(id=i, text=piece(i), logit=lg, prob=pr) for i, lg, pr in zip(ids[p], logits[p], probs[p])
            ),
            entropy=entropy[p],
            next_id=prompt_ids[p + 1],
            next_text=piece(prompt_ids[p + 1]),
            next_prob=next_prob[p],
            next_rank=int(next_rank[p]),
            next_logprob=next_logprob[p],
        )
        for p in range(len(next_prob))
    )
