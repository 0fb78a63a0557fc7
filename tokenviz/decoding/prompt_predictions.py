"""What the model predicted at every prompt position, read from the prefill's logits.

The prefill computes a next-token distribution after each prompt token anyway; this keeps, per
position, the raw top candidates, the entropy, and how likely and how highly ranked the prompt's
own next token was (its surprisal) without holding the whole vocabulary for every position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import overload

import numpy as np
import torch

from tokenviz.contract.records import Candidate, PromptPrediction
from tokenviz.tensors.transfer import ids_to_device

TOP = 5  # candidates kept per prompt position
KEYS = ("ids", "logits", "probs", "entropy", "next_prob", "next_rank", "next_logprob")


def predict_positions(
    position_logits: torch.Tensor, next_ids: Sequence[int], top: int = TOP
) -> dict[str, torch.Tensor]:
    """On the logits' device: for the first len(next_ids) positions, the raw top candidates, the
    entropy in bits, and the probability, 1-based rank and log-probability of `next_ids[i]` after
    position i. Worked through a slice of scores at a time: a 2048-token prefill of a 128k
    vocabulary would otherwise hold about 4 GB of float32 temporaries at once."""
    logits = position_logits[: len(next_ids)]
    following = ids_to_device(next_ids, logits.device)[0]
    numbers = CPU_SLICE_NUMBERS if logits.device.type == "cpu" else SLICE_NUMBERS
    rows = max(1, numbers // logits.shape[-1])
    starts = range(0, len(next_ids), rows) or range(1)  # no position: one empty slice
    parts = [_predict(logits[i : i + rows], following[i : i + rows], top) for i in starts]
    return parts[0] if len(parts) == 1 else {key: torch.cat([part[key] for part in parts]) for key in KEYS}


SLICE_NUMBERS = 2**25  # scores per slice on an accelerator: few launches, 128 MB of float32 at most
# On a CPU, a slice its caches hold: each pass over a larger one is mostly page faults and memory
# traffic (the bundled model's 2048-token prefill spent twice as long on its predictions).
CPU_SLICE_NUMBERS = 2**20


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


class PromptPredictions(Sequence[PromptPrediction]):
    """The predictions at every prompt position, made into records only when read: a 2048-token
    prompt has ten thousand candidates, and building them all (and decoding their pieces) would cost
    a GPU's prefill more than its forward pass, though a view shows a few at a time. Equal to the
    tuple of the same records. `piece` gives a candidate's text from plain data (the session decodes
    every piece in the engine's thread first): a record may outlive its model and cross to the UI."""

    def __init__(
        self,
        host: dict[str, np.ndarray],
        prompt_ids: Sequence[int],
        piece: Callable[[int], str],
    ):
        self._columns = {key: host[f"prompt.{key}"] for key in KEYS}
        self._prompt_ids, self._piece = tuple(prompt_ids), piece
        self._made: list[PromptPrediction | None] = [None] * len(self._columns["next_prob"])

    def __len__(self) -> int:
        return len(self._made)

    @overload
    def __getitem__(self, index: int) -> PromptPrediction: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[PromptPrediction, ...]: ...
    def __getitem__(self, index: int | slice) -> PromptPrediction | tuple[PromptPrediction, ...]:
        if isinstance(index, slice):
            return tuple(self._made_at(p) for p in range(len(self))[index])
        return self._made_at(range(len(self))[index])  # an IndexError past the end, as a tuple's

    def __iter__(self) -> Iterator[PromptPrediction]:
        return (self._made_at(p) for p in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self) -> tuple[type[tuple[PromptPrediction, ...]], tuple[tuple[PromptPrediction, ...]]]:
        return tuple, (tuple(self),)  # a copy (pickled, say) is the records themselves

    def __repr__(self) -> str:
        return f"PromptPredictions({len(self)} positions)"

    def _made_at(self, p: int) -> PromptPrediction:
        made = self._made[p]
        if made is None:
            made = self._made[p] = self._make(p)
        return made

    def _make(self, p: int) -> PromptPrediction:
        column, piece, following = self._columns, self._piece, self._prompt_ids[p + 1]
        ids, logits, probs = (column[key][p].tolist() for key in ("ids", "logits", "probs"))
        return PromptPrediction(
            position=p,
            top=tuple(  # a server that gave fewer than asked leaves rows of -inf: no candidates, not shown
                Candidate(id=i, text=piece(i), logit=lg, prob=pr)
                for i, lg, pr in zip(ids, logits, probs)
                if lg != -math.inf
            ),
            entropy=float(column["entropy"][p]),
            next_id=following,
            next_text=piece(following),
            next_prob=float(column["next_prob"][p]),
            next_rank=int(column["next_rank"][p]),
            next_logprob=float(column["next_logprob"][p]),
        )
