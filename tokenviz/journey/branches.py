"""The branch tree: every path a journey took from its prompt, kept when it is left.

A path is stored only if no stored path already contains it, and storing a path drops the stored
paths it contains, so the store holds the leaves of the tree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tokenviz.contract.engine import shared_prefix
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.interventions import BRANCH_SOURCE, Intervention, Patch
from tokenviz.contract.records import PromptPrediction, StepRecord
from tokenviz.contract.results import BranchSummary


@dataclass(frozen=True)
class Branch:
    """A path the journey took: all its tokens and records."""

    ids: tuple[int, ...]
    records: tuple[StepRecord, ...]
    stop_reason: str | None


@dataclass(frozen=True)
class _Figures:
    text: str
    tokens: int
    logprob: float
    mean_entropy: float


class BranchStore:
    def __init__(self) -> None:
        self.paths: list[Branch] = []
        self._figures: dict[tuple[int, ...], _Figures] = {}  # a stored path never changes: summed up once

    def __len__(self) -> int:
        return len(self.paths)

    def clear(self) -> None:
        self.paths = []

    def keep(self, path: Branch, prompt_len: int) -> None:
        """Store `path`, unless it is only the prompt or another stored path already contains it."""
        if len(path.ids) <= prompt_len or any(b.ids[: len(path.ids)] == path.ids for b in self.paths):
            return
        self.paths = [b for b in self.paths if path.ids[: len(b.ids)] != b.ids] + [path]

    def fill_prompt_predictions(self, predictions: Sequence[PromptPrediction], input_ids: tuple[int, ...]) -> None:
        """Every kept path from this prompt whose first record lacks them gets the prompt's predictions
        (made after the path was kept: see Session.score_prompt)."""

        def filled(b: Branch) -> Branch:
            first = b.records[0] if b.records else None
            if first is None or first.prompt_predictions or first.input_ids != input_ids:
                return b
            return dataclasses.replace(
                b, records=(dataclasses.replace(first, prompt_predictions=predictions), *b.records[1:])
            )

        self.paths = [filled(b) for b in self.paths]

    def remove(self, path: Branch) -> None:
        self.paths = [b for b in self.paths if b is not path]

    def summaries(self, current: Branch, prompt_len: int, decode: Callable[[list[int]], str]) -> list[BranchSummary]:
        """The current path first, then every stored path the current one does not contain."""
        kept = {b.ids for b in self.paths}
        self._figures = {ids: f for ids, f in self._figures.items() if ids in kept}
        out = [self._summary(current, -1, current, prompt_len, decode)]
        for i, b in enumerate(self.paths):
            if current.ids[: len(b.ids)] != b.ids:
                out.append(self._summary(b, i, current, prompt_len, decode))
        return out

    def _summary(
        self, b: Branch, index: int, current: Branch, prompt_len: int, decode: Callable[[list[int]], str]
    ) -> BranchSummary:
        figures = self._figures.get(b.ids) if index != -1 else None
        if figures is None:
            taken = b.records[: len(b.ids) - prompt_len]
            figures = _Figures(
                text=decode(list(b.ids[prompt_len:])),
                tokens=len(b.ids) - prompt_len,
                logprob=float(sum(np.log(max(r.decision.raw_prob, 1e-45)) for r in taken)),
                mean_entropy=float(np.mean([r.entropy for r in taken])) if taken else 0.0,
            )
            if index != -1:
                self._figures[b.ids] = figures
        return BranchSummary(
            index=index,
            text=figures.text,
            tokens=figures.tokens,
            logprob=figures.logprob,
            mean_entropy=figures.mean_entropy,
            shared=shared_prefix(b.ids, current.ids),
            current=index == -1,
        )


def with_branch_source(intervention: Intervention, branches: BranchStore) -> Intervention:
    """A patch from `branch N` with that branch's tokens in it (they stay with it, whatever the branches
    do later); any other intervention as it is."""
    if not isinstance(intervention, Patch) or intervention.source_ids:
        return intervention
    named = BRANCH_SOURCE.fullmatch(intervention.source.strip())
    if named is None:
        return intervention
    n = int(named.group(1))
    if not 1 <= n <= len(branches):
        raise TokenvizError(f"there is no branch {n} to patch from ({len(branches)} kept)")
    return dataclasses.replace(intervention, source_ids=tuple(branches.paths[n - 1].ids))
