"""Two journeys on the same prompt, stepped together, and how their next-token distributions differ.

A and B differ in their sampling settings, their dtype or their model, with one tokenizer. Each step
both take their own next token. Per step: KL(A ‖ B) of the two raw distributions in bits, whether
their top-1 agree, and the rank each gives the other's chosen token; over the journey, the first
step where their chosen tokens part. Models whose vocabularies are padded to different sizes are
compared over the ids they share (each distribution renormalised there).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import StepDiff
from tokenviz.journey.session import Session


def check_same_tokenizer(a: Session, b: Session) -> None:
    """Refuse, in one line, two models whose tokenizers differ: their token ids would not line up."""
    ta, tb = a.runner.tokenizer, b.runner.tokenizer
    if ta.get_vocab() != tb.get_vocab() or ta.all_special_ids != tb.all_special_ids:
        raise TokenvizError(
            f"{a.runner.info.name} and {b.runner.info.name} have different tokenizers: compare needs one tokenizer, "
            "so that each token id means the same text in both"
        )


def rank_in(logits: torch.Tensor, token: int) -> int:
    """The 1-based rank a model's raw distribution gives `token`; one past its last token where the
    model has no such id (the other model's vocabulary is padded further)."""
    if token >= logits.shape[-1]:
        return logits.shape[-1] + 1
    return int((logits > logits[token]).sum()) + 1


@torch.inference_mode()
def step_diff(index: int, a_logits: torch.Tensor, b_logits: torch.Tensor, a_choice: int, b_choice: int) -> StepDiff:
    """The difference of two next-token distributions, computed on the host in float64: the KL over
    the ids both models have, the ranks over each model's own."""
    a_all, b_all = a_logits.reshape(-1).double().cpu(), b_logits.reshape(-1).double().cpu()
    n = min(a_all.shape[-1], b_all.shape[-1])
    la, lb = torch.log_softmax(a_all[:n], -1), torch.log_softmax(b_all[:n], -1)
    kl = float((la.exp() * (la - lb)).nan_to_num().sum()) / math.log(2)
    return StepDiff(
        index=index,
        kl=max(kl, 0.0),
        top1_agree=int(a_all.argmax()) == int(b_all.argmax()),
        a_rank_of_b=rank_in(a_all, b_choice),
        b_rank_of_a=rank_in(b_all, a_choice),
    )


class Comparison:
    def __init__(self, a: Session, b: Session):
        check_same_tokenizer(a, b)
        self.a, self.b = a, b
        self.diffs: list[StepDiff] = []

    @property
    def sessions(self) -> tuple[Session, Session]:
        return self.a, self.b

    @property
    def parted_at(self) -> int | None:
        """The first step where A and B chose different tokens (the pending choices included)."""
        for ra, rb in zip(self.a.records, self.b.records):
            if ra.decision.chosen_id != rb.decision.chosen_id:
                return ra.index
        return None

    def start(
        self,
        prompt: str,
        chat: bool = False,
        system: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        for session in self.sessions:
            session.start(prompt, progress, chat=chat, system=system)
        if self.a.prompt_ids != self.b.prompt_ids:
            raise TokenvizError("the two models tokenize the prompt differently: compare needs one tokenizer")
        self.diffs = []
        self._diff()

    def step(self) -> bool:
        """Both take their next token (one that has stopped stays); True while either goes on."""
        went_on = False
        for session in self.sessions:
            if session.pending is not None:
                went_on = session.step() is not None or went_on
        self._diff()
        return went_on

    def rewind(self, n: int = 1) -> None:
        for session in self.sessions:
            session.rewind(n)
        del self.diffs[min(len(self.a.records), len(self.b.records)) :]
        self._diff()

    def reset(self) -> None:
        for session in self.sessions:
            session.reset()
        del self.diffs[1:]

    def _diff(self) -> None:
        """The diff of the newest step both have pending."""
        a, b = self.a, self.b
        index = len(self.diffs)
        if a.pending_logits is None or b.pending_logits is None or index != len(a.records) - 1:
            return
        if index != len(b.records) - 1:
            return
        self.diffs.append(
            step_diff(
                index,
                a.pending_logits,
                b.pending_logits,
                a.records[-1].decision.chosen_id,
                b.records[-1].decision.chosen_id,
            )
        )
