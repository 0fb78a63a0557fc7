"""The model run here beside the same model a server runs, step by step: the way to see whether a server
(another kernel, another dtype, a quantized copy) computes what your own copy does.

A is the local journey; B is one request to the server at A's context each step, with the same sampling
settings. Per step: KL(A ‖ B) in bits over the server's top-N (both distributions renormalised over
those ids: the server gives no more), whether their top-1 agree, the rank each gives the other's chosen
token (A's over its whole vocabulary; B's from its top-N, or its prompt_logprobs past them); over the
journey, the first step where B would have chosen another token. The server keeps no state, so B is
always asked at A's own context: after the paths part B's figures are B's on A's path (teacher-forced),
as `compare` does for two local models.
"""

from __future__ import annotations

from typing import Any

import torch

from tokenviz.contract.errors import TokenvizError
from tokenviz.journey.comparison import kl_bits, rank_in
from tokenviz.journey.session import Session
from tokenviz.served.journey import ServedJourney


def kl_over(a_logits: torch.Tensor, b_top: dict[int, float]) -> float:
    """KL(A ‖ B) in bits over B's top-N ids, each side renormalised over them."""
    ids = sorted(b_top)
    a = torch.softmax(a_logits.reshape(-1).double().cpu()[torch.tensor(ids)], -1)
    b = torch.softmax(torch.tensor([b_top[i] for i in ids], dtype=torch.float64), -1)
    return kl_bits(a, b)


def compare_with_server(session: Session, served: ServedJourney, prompt: str) -> dict[str, Any]:
    """Both journeys on `prompt` until A stops (its settings' max_new_tokens, or an end), as a document."""
    served.start(prompt)
    session.start(prompt)
    if session.prompt_ids != served.prompt_ids:
        raise TokenvizError(
            f"the server tokenizes the prompt as {len(served.prompt_ids)} tokens and {session.runner.info.name} "
            f"as {len(session.prompt_ids)}: compare needs one tokenizer"
        )
    steps, parted_at = [], None
    while (pending := session.pending) is not None:
        logits = session.pending_logits
        assert logits is not None
        a_choice = pending.decision.chosen_id
        b = served.predict(list(session.ids), pending.index)
        b_top = {c.id: c.logprob for c in b.top}
        past = [t for t in (b.chosen.id, *b_top) if not 0 <= t < logits.numel()]
        if past:
            raise TokenvizError(
                f"the server answered token id {past[0]}, past {session.runner.info.name}'s vocabulary "
                f"({logits.numel():,} tokens): compare needs one tokenizer"
            )
        if parted_at is None and b.chosen.id != a_choice:
            parted_at = pending.index
        steps.append(
            {
                "index": pending.index,
                "a": {"id": a_choice, "text": pending.decision.chosen_text},
                "b": {"id": b.chosen.id, "text": b.chosen.text, "logprob": b.chosen.logprob},
                "kl": kl_over(logits, b_top),
                "top1_agree": int(logits.reshape(-1).argmax()) == b.top[0].id,
                "a_rank_of_b": rank_in(logits.reshape(-1), b.chosen.id),
                "b_rank_of_a": served.rank_of(list(session.ids), a_choice, list(b_top.items())),
                "teacher_forced": parted_at is not None and pending.index > parted_at,
                "request_ms": b.request_ms,
            }
        )
        if session.step() is None:
            break
    return {
        "a": {"model": session.runner.info.name, "text": session.text},
        "b": {"model": served.model, "endpoint": served.endpoint.url, "distribution": served.distribution},
        "kl_over": f"the server's top {served.top_n}, each side renormalised there",
        # Sampled, each side draws on its own (the server by its own generator): a parting is two draws,
        # not two models; greedy, it is the models' choices.
        "independent_draws": not session.settings.greedy,
        "diff": steps,
        "parted_at": parted_at,
    }
