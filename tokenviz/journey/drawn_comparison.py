"""The model run here beside the same model a server runs, step by step: the way to see whether a server
(another kernel, another dtype, a quantized copy) computes what your own copy does.

A is the local journey; B a Session on the served engine, each drawing its own tokens with the same
sampling settings. Per step: KL(A ‖ B) in bits over the server's top-N (both distributions
renormalised over those ids: the server gives no more), whether their top-1 agree, the rank each gives
the other's chosen token (A's over its whole vocabulary; B's from its top-N, or its prompt_logprobs
past them); over the journey, the first step where their tokens part. The server keeps no state, so
after the paths part B is asked at A's own context: B's figures are then B's on A's path
(teacher-forced), as `compare` does for two local models."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from tokenviz.contract.engine import DrawingEngine
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import StepDiff
from tokenviz.journey.comparison import Comparison, kl_bits, rank_in
from tokenviz.journey.session import Session


def kl_over(a_logits: torch.Tensor, b_top: dict[int, float]) -> float:
    """KL(A ‖ B) in bits over B's top-N ids, each side renormalised over them."""
    ids = sorted(b_top)
    a = torch.softmax(a_logits.reshape(-1).double().cpu()[torch.tensor(ids)], -1)
    b = torch.softmax(torch.tensor([b_top[i] for i in ids], dtype=torch.float64), -1)
    return kl_bits(a, b)


def refuse_past_vocabulary(tokens: Iterable[int], a: Session, vocab: int) -> None:
    """Refuse, in one line, a token id the server answered that A's model (of `vocab` tokens) has not."""
    past = [t for t in tokens if not 0 <= t < vocab]
    if past:
        raise TokenvizError(
            f"the server answered token id {past[0]}, past {a.engine.info.name}'s vocabulary ({vocab:,} tokens): "
            "compare needs one tokenizer"
        )


class DrawnComparison(Comparison):
    """The comparison screen's pair when B is the model a server runs (a Session on the served engine):
    A's step as any; B's its own draw, or after the paths part one request at A's context. Per step the
    KL over the server's top N (kl_over); the KL of what each draw is made from is unknown here (the
    server's stages run over its whole vocabulary), so it is NaN, shown as unknown. The screen and
    `compare --against-backend server` headless both step this pair."""

    def __init__(self, a: Session, b: Session):
        super().__init__(a, b)
        self.kl_over = f"the server's top {b.engine.info.covers}, each side renormalised there"

    def _check_pair(self, a: Session, b: Session) -> None:
        """B draws its own tokens (a server); one tokenizer is checked on the prompt's ids (start) and on
        every id the server answers (_diff), the server's own being there only."""
        if not isinstance(b.engine, DrawingEngine):
            raise TypeError("B is a served model's session")
        self.server: DrawingEngine = b.engine

    @property
    def independent_draws(self) -> bool:
        """Sampled, each side draws on its own (the server by its own generator): a parting is two draws."""
        return not self.a.settings.greedy

    def _diff(self) -> None:
        a, b = self.a, self.b
        index = len(self.diffs)
        logits, pending_b = a.pending_logits, b.pending
        if logits is None or pending_b is None or index != len(a.records) - 1 or index != len(b.records) - 1:
            return
        parted = self.parted_at
        forced = parted is not None and index > parted
        if forced:  # B after A's tokens: one request at A's context, B's settings
            drawn = self.server.draw(list(a.ids), b.settings)
            b_choice, b_top = drawn.chosen, dict(drawn.top)
        else:
            b_choice, b_top = pending_b.decision.chosen_id, {c.id: c.logit for c in pending_b.top}
        refuse_past_vocabulary((b_choice, *b_top), a, logits.numel())
        a_choice = a.records[-1].decision.chosen_id
        b_rank_of_a = next((i for i, t in enumerate(b_top, 1) if t == a_choice), None)
        if b_rank_of_a is None:  # past the server's top N: its rank asked of it (one more request)
            b_logprob, b_rank_of_a = self.server.logprob_of(list(a.ids), a_choice)
        else:
            b_logprob = b_top[a_choice]
        scores = logits.reshape(-1)
        a_logprob = float(torch.log_softmax(scores.double(), -1)[a_choice])
        a_top, b_most = int(scores.argmax()), max(b_top, key=b_top.__getitem__)
        self.diffs.append(
            StepDiff(
                index=index,
                kl=kl_over(scores, b_top),
                top1_agree=a_top == b_most,
                a_rank_of_b=rank_in(scores, b_choice),
                b_rank_of_a=b_rank_of_a,
                final_kl=math.nan,
                teacher_forced=forced,
                nll_a=-a_logprob,
                nll_b=-b_logprob,  # (the KLD stays NaN: a sum over every token, and the server gives N)
                dp=math.exp(a_logprob) - math.exp(b_logprob),
                a_top=a_top,
                b_top=b_most,
            )
        )
