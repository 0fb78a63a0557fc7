"""A step's ranking, softmax and summary read in numpy where the logits lie in the CPU's memory
(tensors/vocabulary_rows.py, sampling's _summarised_in_numpy and _greedy_in_numpy): the same numbers as
torch's operators give, which a GPU runs, on rows of a vocabulary's size with ties, masked tokens and
values that are not numbers; the softmax nearer float64's than torch's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import WATCH_N, decide_on_device, summarise
from tokenviz.tensors import transfer, vocabulary_rows
from tokenviz.tensors.transfer import to_host

VOCABULARY = 49_152  # the bundled model's


def _top_k(row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's top-k as a step and the lens rank it: numpy's, torch's where a value is NaN."""
    ranked = vocabulary_rows.top_k_in_numpy(row.numpy(), k)
    if ranked is None:
        return torch.topk(row, min(k, row.numel()))
    return torch.from_numpy(ranked[0]), torch.from_numpy(ranked[1])


def _row(seed: int, size: int = VOCABULARY, case: str = "plain") -> torch.Tensor:
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(size) * 3).astype(np.float32)
    if case == "tied":  # the largest few equal, one of them far into the row
        row[[size - 3, 17, size // 2]] = row.max() + 1
    if case == "masked":  # a grammar's or a server's -inf
        row[::3] = -math.inf
    if case == "quantized":  # a quantized model's logits: few distinct values, many ties
        row = np.round(row * 4) / 4
    if case == "nan":
        row[size // 2] = math.nan
    if case == "inf":
        row[size // 3] = math.inf
    return torch.from_numpy(row)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([40, 300, 10_239, 10_240, 49_152, 50_257, 151_936]),
    k=st.integers(1, 40),
    case=st.sampled_from(["plain", "tied", "masked", "quantized"]),
)
def test_top_k_equals_torchs_with_ties_in_ascending_id(seed, size, k, case):
    row = _row(seed, size, case)
    values, ids = _top_k(row, k)
    theirs = torch.topk(row, k)
    assert values.tolist() == theirs.values.tolist()  # the same values, exactly
    assert row[ids].tolist() == values.tolist()
    order = sorted(range(size), key=lambda i: (-float(row[i]), i))[:k]  # argmax's rule for equal values
    assert ids.tolist() == order


@pytest.mark.parametrize("case", ["plain", "tied", "masked", "quantized", "nan"])
def test_each_rows_top_k_is_torchs(case):
    """The lens's rows ranked (readings): each row's values torch.topk's, a NaN's rows torch's own ranking."""
    logits = torch.stack([_row(seed, case=case) for seed in range(4)])
    read = vocabulary_rows.readings([logits], 3, [0])
    probs = vocabulary_rows.softmax(logits)
    values = torch.tensor([r.top_p for r in read])
    ids = torch.tensor([r.top_ids for r in read])
    theirs = torch.topk(probs, 3, dim=-1)
    assert values.shape == ids.shape == (4, 3)
    assert torch.equal(values, theirs.values) or (case == "nan" and torch.equal(ids, theirs.indices))
    assert all(torch.equal(ids[i], _top_k(row, 3)[1]) for i, row in enumerate(probs)) or case == "nan"


@pytest.mark.parametrize("case", ["plain", "tied", "masked", "quantized", "nan", "inf"])
def test_argmax_equals_torchs(case):
    row = _row(1, case=case)
    assert int(vocabulary_rows.argmax(row)) == int(torch.argmax(row))
    if case in ("plain", "tied", "masked", "quantized"):
        assert int(vocabulary_rows.argmax(row)) == int(_top_k(row, 1)[1][0])


def test_a_nan_leaves_the_ranking_to_torch():
    row = _row(2, case="nan")
    values, ids = _top_k(row, 5)
    assert ids.tolist() == torch.topk(row, 5).indices.tolist() and math.isnan(values[0])


@pytest.mark.parametrize("case", ["plain", "masked", "quantized"])
@pytest.mark.parametrize("size", [300, VOCABULARY, 151_936])
def test_the_softmax_is_float64s_within_float32s_rounding_and_one_row_or_several_the_same(case, size):
    rows = torch.stack([_row(seed, size, case) for seed in range(3)])
    exact = torch.softmax(rows.double(), -1)
    ours = vocabulary_rows.softmax(rows)
    assert ours.dtype == torch.float32 and (ours.double() - exact).abs().max() < 1e-7
    assert all(torch.equal(vocabulary_rows.softmax(row), ours[i]) for i, row in enumerate(rows))
    with_torch = torch.softmax(rows, -1)  # (a GPU's; on a CPU, 5e-6 off float64's at 49,152 logits)
    assert (with_torch.double() - exact).abs().max() < 1e-5


@pytest.mark.parametrize("case", ["plain", "tied", "masked", "quantized", "nan"])
def test_a_lens_rows_readings_in_numpy_are_torchs(monkeypatch, case):
    """A lens's rows read a row at a time in numpy (top-3, the followed ids' probabilities and ranks) against
    torch's operators over all the rows at once (a GPU's): the same ids and ranks, the probabilities within
    float32's rounding of a softmax; rows in two blocks read as one."""
    rows = torch.stack([_row(seed, case=case) for seed in range(5)])
    followed = [int(torch.argmin(rows[0])), 17, int(torch.argmax(rows[3]))]
    ours = vocabulary_rows.readings([rows[:3], rows[3:]], 3, followed)
    monkeypatch.setattr(transfer, "numpy_reads", lambda tensor: False)
    theirs = vocabulary_rows.readings([rows], 3, followed)
    assert len(ours) == len(theirs) == 5
    for mine, their in zip(ours, theirs):
        assert mine.followed_ranks == their.followed_ranks
        assert mine.followed_p == pytest.approx(their.followed_p, rel=1e-5, nan_ok=True)
        assert mine.top_p == pytest.approx(their.top_p, rel=1e-5, nan_ok=True)
        assert mine.top_ids == their.top_ids or case in ("tied", "quantized", "nan")  # (torch's order of equals)
    if case == "plain":
        probs = torch.softmax(rows.double(), -1)
        ranks = [(probs[3] > probs[3, i]).sum().item() + 1 for i in followed]
        assert ours[3].followed_ranks == tuple(ranks) and ours[3].followed_ranks[2] == 1


def _greedy(logits: torch.Tensor, n: int = 10):
    summary = summarise(logits, n)
    pending = decide_on_device(logits, SamplingSettings(temperature=0), [1, 2], [], summary=summary)
    host = to_host({**summary.tensors, **pending.tensors})
    top, entropy = summary.read(host, str)
    return summary, top, entropy, pending.read(host, str)


@pytest.mark.parametrize("case", ["plain", "tied", "masked", "quantized"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_greedy_step_in_numpy_equals_the_devices(monkeypatch, case, seed):
    """Every number of the summary and greedy decision, read in numpy, against torch's path (a GPU's),
    within float32's rounding of a softmax; the entropy against float64's Σ p log p."""
    logits = _row(seed, case=case)
    summary, top, entropy, decision = _greedy(logits)
    monkeypatch.setattr(transfer, "numpy_reads", lambda tensor: False)
    _, their_top, their_entropy, theirs = _greedy(logits)
    assert summary.on_host
    assert [c.id for c in top] == [c.id for c in their_top] or case in ("tied", "quantized")
    assert [c.logit for c in top] == [c.logit for c in their_top]
    assert [c.prob for c in top] == pytest.approx([c.prob for c in their_top], rel=1e-5)
    exact = torch.special.entr(torch.softmax(logits.double(), -1)).sum().item() / math.log(2)
    assert entropy == pytest.approx(exact, abs=1e-4) and their_entropy == pytest.approx(exact, abs=1e-4)
    assert decision.chosen_id == theirs.chosen_id == int(torch.argmax(logits))
    assert decision.chosen_prob == pytest.approx(theirs.chosen_prob, rel=1e-5)
    assert (decision.raw_rank, decision.chosen_rank) == (theirs.raw_rank, theirs.chosen_rank) == (1, 1)
    assert decision.watch == theirs.watch or case in ("tied", "quantized")
    assert len(decision.watch) == WATCH_N
    assert list(decision.raw_probs) == pytest.approx(list(theirs.raw_probs), rel=1e-5)
    assert decision.band is None and decision.stages == theirs.stages == ()


@pytest.mark.parametrize("case", ["nan", "inf"])
def test_a_logit_that_is_not_a_number_still_stops_the_decision(case):
    with pytest.raises(TokenvizError, match="not a number"):
        _greedy(_row(3, case=case))


def test_the_numpy_path_is_taken_on_a_vocabulary_row_in_the_cpus_memory():
    summary, *_ = _greedy(_row(4))
    assert summary.on_host and summary.probs.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_to_host_copies_each_part_in_the_cpus_memory():
    parts = {
        "half": torch.randn(3, 5, 7).half(),
        "ids": torch.tensor([5, 1, 2**40]),
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.25, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
        "grad": torch.ones(2, requires_grad=True),
    }
    host = to_host(parts)
    assert list(host) == list(parts)
    for name, tensor in parts.items():
        assert host[name].dtype == tensor.detach().numpy().dtype and host[name].shape == tuple(tensor.shape), name
        assert np.array_equal(host[name], tensor.detach().numpy()), name
    parts["float"] = torch.zeros(2)
    copied = to_host({"float": parts["float"]})["float"]
    parts["float"][0] = 7.0  # a copy: the step's numbers stay as they were read
    assert copied.tolist() == [0.0, 0.0]
