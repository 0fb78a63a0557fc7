"""A text scored against a base (journey.against_base) on tiny transformers models: the lens at the tails is
read from what each side's scoring pass kept, and equals the lens the runner reads in a pass of its own;
no more than the running tails' residuals are ever kept; the tails of parts are the tails of the whole."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.results import LensAsk
from tokenviz.decoding.perplexity_statistics import Tally, TokenComparison
from tokenviz.journey import against_base
from tokenviz.journey.against_base import TAILS, KeptLenses, score_against_base, tail_rows, windows

SIZE = 16
TEXT = "The harbour town woke slowly. Fishing boats came in before the light, their engines low. " * 3


def two_models() -> tuple[ModelRunner, ModelRunner]:
    """A tiny model and a copy whose head is untied and moved (a tiny model's top-1 is its last token)."""
    base = tiny_model(context=256)
    q = copy.deepcopy(base)
    torch.manual_seed(0)
    head = base.model.get_output_embeddings().weight.detach()
    q.model.lm_head.weight = torch.nn.Parameter(head + torch.randn_like(head) * head.std())
    return ModelRunner(q), ModelRunner(base)


def test_the_lens_at_each_tail_is_the_runners_own_lens_there(monkeypatch):
    """Each tail's lens, read from the scoring pass's kept residuals, equals the lens `inspect` reads over the
    tail's window in a pass of its own: every layer's top-1 and its probability; and at no window were more
    residuals kept than the running tails need."""
    held: list[int] = []
    keep = KeptLenses.keep

    def counted(self, *args):
        keep(self, *args)
        held.append(len(self.rows))

    monkeypatch.setattr(KeptLenses, "keep", counted)
    q, base = two_models()
    doc = score_against_base(q, base, TEXT, SIZE)
    assert doc["windows"] >= 3 and held and max(held) <= 3 * TAILS
    ids = base.encode(TEXT, special_tokens=True)
    cut = windows(ids, SIZE, against_base.added_bos(base, TEXT))
    tails = doc["tails"]
    lensed = {t["index"]: t for t in (*tails["by_kld"], *tails["by_dp"], *tails["changed_top"][:TAILS])}
    assert len(lensed) >= TAILS
    for index, t in lensed.items():
        window, place = cut[index // SIZE], index % SIZE
        ask = LensAsk(tuple(window), (place - 1,), (window[place],))
        for engine, side in ((q, "top"), (base, "base_top")):
            own = engine.inspect(ask)[0].lens
            assert [row.top[0][0] for row in own] == [row["id"] for row in t["lens"][side]], (index, side)
            for row, seen in zip(own, t["lens"][side], strict=True):
                assert seen["prob"] == pytest.approx(row.top[0][2], abs=1e-5), (index, side, row.layer)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 5), st.floats(-1, 1), st.booleans()), min_size=1, max_size=80),
    st.integers(1, 20),
)
def test_the_tails_of_the_running_tails_are_the_tails_of_the_whole(rows, part):
    """KeptLenses keeps, window by window, the tails of (what it kept, the new rows): at the end they are the
    tails of every row, ties and all."""
    tally = Tally([TokenComparison(0.0, 0.0, kld, dp, int(changed), 0) for kld, dp, changed in rows])
    kept: list[int] = []
    for start in range(0, len(rows), part):
        by_kld, by_dp, changed = tail_rows(tally, [*kept, *range(start, min(start + part, len(rows)))], True)
        kept = sorted({*by_kld, *by_dp, *changed[:TAILS]})
    by_kld, by_dp, changed = tail_rows(tally, range(len(rows)), True)
    assert {*by_kld, *by_dp, *changed[:TAILS]} <= set(kept)
    assert tail_rows(tally, kept, True)[:2] == (by_kld, by_dp)
