"""Attention computed on demand: the fast path keeps query states within a budget and feeds rows
again when they are gone; eager-only families answer from an eager pass; every answer equals eager
attention over the whole sequence, and asking never changes the journey."""

import pytest
import torch
from families import family_model, gemma3n_config, gemma4_config, model_of
from stock import saved, stock_forward
from tiny import tiny_model

from tokenviz.backends.transformers.loading import LoadedModel
from tokenviz.backends.transformers.query_store import QueryStore
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session

# llama: plain; gemma2: hybrid sliding/global layers with soft-capping (eager inside the fast path);
# bloom: ALiBi, no fast path in transformers (eager throughout).
KINDS = ["llama", "gemma2", "bloom"]


def journey(kind: str | LoadedModel, budget: int | None = None, steps: int = 10) -> Session:
    runner = ModelRunner(family_model(kind) if isinstance(kind, str) else kind)
    runner.eos_ids = set()
    if budget is not None:
        runner.rows.queries = QueryStore(budget)
    s = Session(runner, SamplingSettings(temperature=0, max_new_tokens=1000))
    s.start(list(range(5, 25)))
    for _ in range(steps):
        s.step()
    return s


def reference(s: Session):
    """Eager attention over the whole sequence, from transformers' own model of these weights (tests/stock.py)."""
    return [a[0].numpy() for a in stock_forward(saved(s.engine.model), s.cached_ids).attentions]


@pytest.mark.parametrize("kind", KINDS)
def test_rows_whose_queries_were_dropped_are_fed_again_and_leave_the_journey_as_it_was(kind):
    s = journey(kind, budget=2_000)  # a few positions' queries at most
    assert s.engine.rows.queries.nbytes <= 2_000 or not s.engine.rows.fast
    full = reference(s)
    keys_before = [layer.keys.clone() for layer in s.engine.cache.layers]
    pending = s.pending_logits.clone()
    for rows in (range(0, 7), range(12, 30), range(29, 30)):
        shown = s.attention(rows, [0, 3])
        for i, layer in enumerate((0, 3)):
            assert abs(shown[i] - full[layer][:, rows.start : rows.stop, : rows.stop]).max() < 1e-5
    assert s.engine.kv_len == len(s.ids) == 30
    assert all(torch.equal(a, b.keys) for a, b in zip(keys_before, s.engine.cache.layers))
    s.step()  # the next step is the one it would have been
    s.rewind(1)
    assert torch.allclose(s.pending_logits, pending, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_after_a_rewind_and_another_token_the_rows_are_the_new_paths(kind):
    s = journey(kind)
    s.attention(range(20, 30), [1])  # kept for the old path
    s.rewind(4)
    s.take_rank(3)
    s.step()
    full = reference(s)
    n = s.engine.kv_len
    shown = s.attention(range(n - 6, n), [1])
    assert abs(shown[0] - full[1][:, n - 6 : n, :n]).max() < 1e-5


def test_the_query_store_stays_within_its_budget_and_forgets_cropped_positions():
    s = journey("llama", budget=40_000)
    store = s.engine.rows.queries
    assert 0 < store.nbytes <= 40_000
    kept = [p for p in range(30) if not store.missing(range(p, p + 1))]
    assert kept and kept[-1] == 29  # the newest are kept
    s.rewind(3)
    assert s.engine.kv_len == 27 and store.missing(range(26, 30)) == [27, 28, 29]


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_a_pass_longer_than_the_store_holds_keeps_its_last_positions_and_the_rest_are_fed_again(kind):
    per_position = journey(kind, steps=0).engine.rows.queries.nbytes // 20  # (its 20-token prompt kept whole)
    runner = ModelRunner(family_model(kind))
    runner.eos_ids = set()
    runner.rows.queries = QueryStore(6 * per_position, per_position)
    s = Session(runner, SamplingSettings(temperature=0, max_new_tokens=1000))
    s.start(list(range(5, 25)))  # one pass of 20 positions: only the last 6 are kept, the others never held
    store = s.engine.rows.queries
    assert store.missing(range(0, 20)) == list(range(14)) and store.nbytes == 6 * per_position
    full = reference(s)
    shown = s.attention(range(0, 20), [0, 1])
    for i in (0, 1):
        assert abs(shown[i] - full[i][:, 0:20, :20]).max() < 1e-5


def test_the_model_info_says_which_attention_runs():
    assert family_model("llama").info.attention.startswith("sdpa")
    assert family_model("bloom").info.attention.startswith("eager")


def test_an_eager_only_model_feeds_only_the_new_rows_when_the_window_moves_on():
    s = journey("bloom")
    fed = []
    forward = s.engine.model.forward

    def counted(*args, **kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        fed.append(ids.shape[1])
        return forward(*args, **kwargs)

    s.engine.model.forward = counted
    s.attention(range(20, 30), [0])
    s.attention(range(20, 30), [3])  # another layer: nothing fed
    s.step()
    s.attention(range(21, 31), [2])  # one position on: only it is fed
    assert fed == [10, 1, 1]  # the step's own forward pass, then the one new row
    full = reference(s)
    assert abs(s.attention(range(21, 31), [2])[0] - full[2][:, 21:31, :31]).max() < 1e-5


def test_the_query_budget_keeps_the_last_positions_within_a_share_of_the_free_memory(monkeypatch):
    from tokenviz.backends.transformers import exact_attention
    from tokenviz.backends.transformers.query_store import QUERY_FLOOR, QUERY_POSITIONS, QUERY_SHARE, query_budget

    monkeypatch.setattr(exact_attention, "free_bytes", lambda device, limits: (80 * 10**9, False))
    runner = ModelRunner(tiny_model("llama"))
    i = runner.info
    per_position = i.layers * i.heads * i.head_dim * 4
    assert runner.rows.queries.budget == QUERY_POSITIONS * per_position
    assert i.queries_kept.startswith(f"the last {QUERY_POSITIONS:,} positions")
    # An 8B model (32 layers x 32 heads x 128, bfloat16) on a GPU with 60 GB free keeps the positions, 268 MB.
    eight_b = 32 * 32 * 128 * 2
    assert query_budget(60 * 10**9, eight_b) == QUERY_POSITIONS * eight_b
    # A position of 4 MB (a 405B model) where 10 GB are free: its share, 200 MB, about 48 positions.
    assert query_budget(10 * 10**9, 4 << 20) == int(QUERY_SHARE * 10 * 10**9)
    assert query_budget(10**9, 4 << 20) == QUERY_FLOOR  # (never less than one screen's worth of a small model)


def every_row_equals_eager(s: Session) -> None:
    n = s.engine.kv_len
    shown = s.attention(range(n), range(s.engine.info.layers))
    for layer, attention in enumerate(reference(s)):
        assert abs(shown[layer] - attention[:, :n, :n]).max() < 1e-5


def test_layers_that_share_an_earlier_layers_keys_show_their_rows_over_them():
    """Gemma 3n's last layers attend over the keys of the last layer of their kind before them: the
    cache holds fewer layers than the model, and each layer's rows are read over the keys it used."""
    s = journey(model_of(gemma3n_config(shared=2), "tiny-gemma3n"), steps=4)
    assert len(s.engine.cache.layers) == 2 < s.engine.info.layers == 4
    every_row_equals_eager(s)


def test_a_model_that_skips_positions_in_its_shared_layers_is_fed_every_position_where_they_are_read():
    """Gemma 4 feeds only the positions whose logits are kept through its KV-shared layers: rows fed
    again (the query budget all but empty) and the lens still see every position of every layer."""
    from tokenviz.backends.transformers.lens import inspect_positions

    s = journey(model_of(gemma4_config(shared=2), "tiny-gemma4"), budget=1, steps=3)  # every row fed again
    every_row_equals_eager(s)
    last = inspect_positions(s.engine, s.ids, [len(s.ids) - 1], [s.pending.decision.chosen_id])[0].lens[-1]
    assert [i for i, _, _ in last.top] == [c.id for c in s.pending.top[: len(last.top)]]


def test_the_fast_path_feeds_again_only_from_the_first_row_missing():
    """The newest rows' queries gone (as after a step whose queries could not be kept): they are fed, not the window."""
    s = journey("llama")
    fed = []
    forward = s.engine.model.forward

    def counted(*args, **kwargs):
        fed.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    s.engine.model.forward = counted
    s.attention(range(20, 30), [0])  # kept from the steps: nothing fed
    s.engine.rows.queries.drop_from(27)
    shown = s.attention(range(20, 30), [0, 3])
    assert fed == [3]
    s.engine.model.forward = forward
    full = reference(s)
    for i, layer in enumerate((0, 3)):
        assert abs(shown[i] - full[layer][:, 20:30, :30]).max() < 1e-5
