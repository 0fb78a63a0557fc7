"""Two journeys on the same prompt, stepped together, and how their next-token distributions differ.

A and B differ in their sampling settings, their dtype or their model, with one tokenizer. Each step
both take their own next token. Per step, in bits: KL(A ‖ B) of the two raw distributions (the
models' own: a sampling setting does not change it) and of the two final ones (what each draw is
made from: there a sampling setting shows); whether their top-1 agree, and the rank each gives the
other's chosen token; over the journey, the first step where their chosen tokens part. Once they
have parted, their contexts differ, and a row of A against B would compare two contexts, not two
settings or models: from then on B's figures are B's on A's path (teacher-forced: B's model fed A's
tokens, B's settings applied there), so every row compares like with like. Models whose
vocabularies are padded to different sizes are compared over the ids they share (each distribution
renormalised there).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from tokenviz.contract.engine import Engine, scores_of
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.results import StepDiff
from tokenviz.decoding.perplexity_statistics import (
    KLD_NOT_GIVEN,
    BaseLogProbs,
    Tally,
    TokenComparison,
    compare_token,
)
from tokenviz.decoding.sampling import choice_from, final_distribution
from tokenviz.journey.session import Session


def check_same_tokenizer(a: Session, b: Session) -> None:
    """Refuse, in one line, two models whose tokenizers differ: their token ids would not line up. Where
    one engine has no Hugging Face tokenizer (llama.cpp's has its own), every id must give the same text."""
    ta, tb = a.engine.tokenizer, b.engine.tokenizer
    if ta is not None and tb is not None:
        same = ta.get_vocab() == tb.get_vocab() and ta.all_special_ids == tb.all_special_ids
    else:
        ids = range(a.engine.info.vocab)
        a.engine.learn_pieces(ids)
        b.engine.learn_pieces(ids)
        same = a.engine.info.vocab == b.engine.info.vocab and all(a.engine.piece(i) == b.engine.piece(i) for i in ids)
    if not same:
        raise TokenvizError(
            f"{a.engine.info.name} and {b.engine.info.name} have different tokenizers: compare needs one tokenizer, "
            "so that each token id means the same text in both"
        )


def rank_in(logits: torch.Tensor, token: int) -> int:
    """The 1-based rank a model's raw distribution gives `token`; one past its last token where the
    model has no such id (the other model's vocabulary is padded further)."""
    if token >= logits.shape[-1]:
        return logits.shape[-1] + 1
    return int((logits > logits[token]).sum()) + 1


def kl_bits(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p ‖ q) in bits of two distributions over the same ids, in float64; infinite where p puts
    mass on an id q rules out."""
    p, q = p.double(), q.double()
    kept = p > 0
    if bool((q[kept] <= 0).any()):
        return math.inf
    return max(float((p[kept] * (p[kept].log() - q[kept].log())).sum()) / math.log(2), 0.0)


@torch.inference_mode()
def step_diff(
    index: int,
    a_logits: torch.Tensor,
    b_logits: torch.Tensor,
    a_choice: int,
    b_choice: int,
    finals: tuple[torch.Tensor, torch.Tensor] | None = None,
    teacher_forced: bool = False,
) -> StepDiff:
    """The difference of two next-token distributions, computed on the host in float64: the KLs over
    the ids both models have (of the raw distributions, and of the `finals` the draws are made from),
    the ranks over each model's own."""
    a_all, b_all = a_logits.reshape(-1).double().cpu(), b_logits.reshape(-1).double().cpu()
    n = min(a_all.shape[-1], b_all.shape[-1])
    la, lb = torch.log_softmax(a_all[:n], -1), torch.log_softmax(b_all[:n], -1)
    kl = float((la.exp() * (la - lb)).nan_to_num().sum()) / math.log(2)
    final_kl = 0.0
    if finals is not None:
        fa, fb = (f.reshape(-1).double().cpu()[:n] for f in finals)
        shared = float(fa.sum()) > 0 and float(fb.sum()) > 0  # a padded id may hold one side's whole mass
        final_kl = kl_bits(fa / fa.sum(), fb / fb.sum()) if shared else math.inf
    as_base = base_figures(a_all[:n], b_all[:n], a_choice) if a_choice < n else {}
    return StepDiff(
        index=index,
        kl=max(kl, 0.0),
        top1_agree=int(a_all.argmax()) == int(b_all.argmax()),
        a_rank_of_b=rank_in(a_all, b_choice),
        b_rank_of_a=rank_in(b_all, a_choice),
        final_kl=final_kl,
        teacher_forced=teacher_forced,
        a_top=int(a_all.argmax()),
        b_top=int(b_all.argmax()),
        **as_base,
    )


def base_figures(a_logits: torch.Tensor, b_logits: torch.Tensor, token: int) -> dict[str, float]:
    """A step's figures as llama-perplexity computes a scored token's, B the base and A's chosen token
    the text's (StepDiff's nll_a, nll_b, kld, dp): the same float32 arithmetic, B's log-probabilities
    kept in its 16 bits, so a journey's statistics are llama-perplexity's definitions to the digit."""
    b = BaseLogProbs.of(b_logits.float().numpy()[None, :])
    scored = compare_token(a_logits.float().numpy(), b, token)
    return {"nll_a": scored.nll, "nll_b": scored.nll_base, "kld": scored.kld, "dp": scored.p_diff}


def journey_statistics(diffs: Sequence[StepDiff]) -> dict[str, Any] | None:
    """llama-perplexity's statistics of a comparison's steps so far (`--kl-divergence`'s, each figure by
    the name `score --against-model` gives it), B the base: every step's token is the one A chose (B is
    forced along A's path once they part), so A is scored on its own journey and B on A's. None before a
    step both can score. Where B is served (its top N), the KLD figures are None, named in "not_given"."""
    scored = [d for d in diffs if math.isfinite(d.nll_a) and math.isfinite(d.nll_b)]
    if not scored:
        return None
    return Tally([TokenComparison(d.nll_a, d.nll_b, d.kld, d.dp, d.a_top, d.b_top) for d in scored]).statistics()


@dataclass
class RunningFigures:
    """The figures of journey_statistics a frame shows (the mean KLD, same top p, RMS Δp, the PPL ratio), kept
    as sums over the steps counted so far: a frame costs its new steps, not the journey's length. Steps are
    only added or cut from the end (a rewind): where the last counted is no longer there, it counts again."""

    counted: int = 0
    last: StepDiff | None = None
    scored: int = 0
    nll_a: float = 0.0
    nll_b: float = 0.0
    kld: float = 0.0
    kld_unknown: int = 0
    dp2: float = 0.0
    same: int = 0

    def of(self, diffs: Sequence[StepDiff]) -> dict[str, Any] | None:
        if len(diffs) < self.counted or (self.counted and diffs[self.counted - 1] is not self.last):
            for name in fields(self):  # (a rewind took counted steps: count again)
                setattr(self, name.name, name.default)
        for d in diffs[self.counted :]:
            if math.isfinite(d.nll_a) and math.isfinite(d.nll_b):
                self.scored += 1
                self.nll_a, self.nll_b, self.dp2 = self.nll_a + d.nll_a, self.nll_b + d.nll_b, self.dp2 + d.dp**2
                self.same += d.a_top == d.b_top
                if math.isnan(d.kld):
                    self.kld_unknown += 1
                else:
                    self.kld += d.kld
        self.counted, self.last = len(diffs), diffs[-1] if diffs else None
        if not self.scored:
            return None
        n = self.scored
        return {
            "count": n,
            "mean_kld": None if self.kld_unknown else self.kld / n,
            "same_top_p": self.same / n,
            "rms_dp": math.sqrt(self.dp2 / n),
            "ppl_ratio": math.exp((self.nll_a - self.nll_b) / n),
            **({"not_given": [KLD_NOT_GIVEN]} if self.kld_unknown else {}),
        }


class Comparison:
    kl_over = ""  # over what the KL is taken, where not the whole vocabulary (see drawn_comparison)

    def __init__(self, a: Session, b: Session):
        self._check_pair(a, b)
        self.a, self.b = a, b
        self.diffs: list[StepDiff] = []
        self._running = RunningFigures()
        self._b_on_a: Engine | None = None  # B's model kept on A's path, once the paths have parted
        self._b_on_a_fed: list[int] = []
        self._b_on_a_logits: torch.Tensor | None = None

    def _check_pair(self, a: Session, b: Session) -> None:
        """Refuse, in one line, two sessions that cannot be compared."""
        check_same_tokenizer(a, b)

    @property
    def sessions(self) -> tuple[Session, Session]:
        return self.a, self.b

    @property
    def independent_draws(self) -> bool:
        """Whether the two sides draw on their own (a parting may be two draws, not two models): here
        both draw with the same uniform at each position, so a parting is their distributions'."""
        return False

    @property
    def statistics(self) -> dict[str, Any] | None:
        """The steps so far in llama-perplexity's terms, B the base (journey_statistics): every figure."""
        return journey_statistics(self.diffs)

    @property
    def running_figures(self) -> dict[str, Any] | None:
        """The figures of `statistics` a frame shows, kept as running sums (RunningFigures)."""
        return self._running.of(self.diffs)

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
        self._b_on_a, self._b_on_a_fed, self._b_on_a_logits = None, [], None
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
        self._b_on_a = None  # its cache goes: the paths have not parted at the prompt
        self._b_on_a_fed, self._b_on_a_logits = [], None

    def _diff(self) -> None:
        """The diff of the newest step both have pending; after the paths have parted, B's side is
        B's model and settings on A's path."""
        a, b = self.a, self.b
        index = len(self.diffs)
        if a.pending_logits is None or b.pending_logits is None or index != len(a.records) - 1:
            return
        if index != len(b.records) - 1:
            return
        parted = self.parted_at
        forced = parted is not None and index > parted
        b_logits = self._b_logits_on_a_path() if forced else b.pending_logits
        a_final = final_distribution(
            a.pending_logits, a.settings, a.ids, a.generated_ids, a.grammars.allowed(a.settings, a.generated_ids)
        )
        b_context = a if forced else b
        b_allowed = b.grammars.allowed(b.settings, b_context.generated_ids)  # none: A's path left B's grammar
        b_final = final_distribution(b_logits, b.settings, b_context.ids, b_context.generated_ids, b_allowed)
        b_choice = b.records[-1].decision.chosen_id
        if forced:  # where B's grammar rules A's path out, B's own top stands for a choice it cannot make
            b_choice = choice_from(b_final, b.settings, len(a.ids)) if b_final.any() else int(b_logits.argmax())
        self.diffs.append(
            step_diff(
                index,
                a.pending_logits,
                b_logits,
                a.records[-1].decision.chosen_id,
                b_choice,
                finals=(a_final, b_final),
                teacher_forced=forced,
            )
        )

    def _b_logits_on_a_path(self) -> torch.Tensor:
        """B's raw next-token logits after A's tokens: a runner of B's model follows A's path, fed
        only what it has not seen (a rewind crops it back), in the passes a journey feeds (the prompt
        in one, then a token a pass): a runtime's numbers depend on its batch's shape (llama.cpp's
        K-quant kernels), and B's figures are to be those of B's own journey on A's path."""
        ids = self.a.ids
        if self._b_on_a is None:
            self._b_on_a = self.b.engine.twin()
        runner, fed = self._b_on_a, self._b_on_a_fed
        common = next((i for i, (x, y) in enumerate(zip(fed, ids)) if x != y), min(len(fed), len(ids)))
        if common == len(ids) == len(fed) and self._b_on_a_logits is not None:
            return self._b_on_a_logits
        keep = min(common, len(ids) - 1)  # at least the last token is fed: its logits are the answer
        runner.crop(keep)
        prompt_len, chunk = len(self.a.prompt_ids), self.b.prefill_chunk
        passes = [ids[i : min(i + chunk, prompt_len)] for i in range(keep, prompt_len, chunk)]  # (keep 0 here)
        passes += [[token] for token in ids[max(keep, prompt_len) :]]
        for fed_ids in passes:
            logits = runner.forward(fed_ids)
        self._b_on_a_logits = scores_of(logits)
        self._b_on_a_fed = list(ids)
        return self._b_on_a_logits
