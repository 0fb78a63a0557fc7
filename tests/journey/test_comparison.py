"""Two journeys compared: the KL divergence, top-1 agreement and ranks of every step equal a direct
computation on the two models' own distributions; the paths part where their tokens first differ;
different tokenizers are refused in one line; compare --json prints both journeys and the diff."""

import copy
import dataclasses
import json
import math

import pytest
import torch
from clitools import invoke
from stock import saved, stock_forward
from tiny import eager_forward, save_tiny, tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.errors import TokenvizError
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.sampling import choice_from, final_distribution
from tokenviz.journey.comparison import Comparison
from tokenviz.journey.session import Session

PROMPT = "The Eiffel Tower is located in"


def paired(a_loaded, b_loaded, a_settings, b_settings) -> Comparison:
    return Comparison(Session(ModelRunner(a_loaded), a_settings), Session(ModelRunner(b_loaded), b_settings))


def test_every_steps_difference_is_computed_from_the_two_models_own_distributions():
    a_model, b_model = tiny_model(seed=0), tiny_model(seed=1)  # one tokenizer, two sets of weights
    sampled = SamplingSettings(temperature=0.9, top_k=0, top_p=1.0, seed=3, max_new_tokens=8)
    comparison = paired(a_model, b_model, sampled, sampled.replace(seed=4))
    comparison.start(PROMPT)
    while comparison.step():
        pass
    a, b = comparison.sessions
    assert len(comparison.diffs) == min(len(a.records), len(b.records))
    chosen = [(ra.decision.chosen_id, rb.decision.chosen_id) for ra, rb in zip(a.records, b.records)]
    parted = next(i for i, (x, y) in enumerate(chosen) if x != y)
    assert comparison.parted_at == parted
    n = len(a.prompt_ids)
    direct: list[tuple[float, float, float]] = []  # each step's nll_a, nll_b and KL(B ‖ A) in nats
    for diff, ra, rb in zip(comparison.diffs, a.records, b.records, strict=False):
        # Up to the parting both read one context; after it, B is B's model on A's path (teacher-forced).
        assert diff.teacher_forced == (diff.index > parted)
        context_a = a.ids[: ra.position]
        context_b = context_a if diff.teacher_forced else b.ids[: rb.position]
        logits_a = stock_forward(saved(a_model.model), context_a).logits[0, -1]
        logits_b = stock_forward(saved(b_model.model), context_b).logits[0, -1]
        la, lb = torch.log_softmax(logits_a.double(), -1), torch.log_softmax(logits_b.double(), -1)
        kl = float((la.exp() * (la - lb)).sum()) / math.log(2)
        assert diff.kl == pytest.approx(kl, abs=1e-5)
        fa = final_distribution(logits_a, a.settings, context_a, context_a[n:]).double()
        fb = final_distribution(logits_b, b.settings, context_b, context_b[n:]).double()
        final_kl = float((fa * (fa.log() - fb.log())).sum()) / math.log(2)  # (top-k 0, top-p 1: all kept)
        assert diff.final_kl == pytest.approx(final_kl, abs=1e-5)
        b_choice = choice_from(fb, b.settings, ra.position) if diff.teacher_forced else rb.decision.chosen_id
        assert diff.top1_agree == (int(la.argmax()) == int(lb.argmax()))
        assert diff.a_rank_of_b == int((la > la[b_choice]).sum()) + 1
        assert diff.b_rank_of_a == int((lb > lb[ra.decision.chosen_id]).sum()) + 1
        # llama-perplexity's figures of the step, B the base and A's token the text's (B's log-probabilities
        # kept in its 16 bits: within 1e-3 nats of the float64 ones here)
        token = ra.decision.chosen_id
        kept = lb > -16.0
        direct.append((-float(la[token]), -float(lb[token]), float((lb.exp() * (lb - la))[kept].sum())))
        assert (diff.nll_a, diff.nll_b, diff.kld) == pytest.approx(direct[-1], abs=1e-3)
        assert diff.dp == pytest.approx(math.exp(la[token]) - math.exp(lb[token]), abs=1e-4)
        assert (diff.a_top, diff.b_top) == (int(la.argmax()), int(lb.argmax()))
    statistics = comparison.statistics
    assert statistics is not None and statistics["count"] == len(comparison.diffs) == len(direct)
    nll_a, nll_b, kld = (torch.tensor(column, dtype=torch.float64) for column in zip(*direct))
    assert statistics["mean_kld"] == pytest.approx(float(kld.mean()), abs=1e-3)
    assert statistics["ppl_ratio"] == pytest.approx(math.exp(float(nll_a.mean() - nll_b.mean())), rel=1e-3)
    assert statistics["same_top_p"] == pytest.approx(sum(d.top1_agree for d in comparison.diffs) / len(direct))
    dp = torch.tensor([d.dp for d in comparison.diffs], dtype=torch.float64)
    assert statistics["rms_dp"] == pytest.approx(float(dp.pow(2).mean().sqrt()), rel=1e-6)


def test_two_settings_on_one_model_agree_until_their_choices_part_and_rewind_keeps_the_diff():
    loaded = tiny_model()
    comparison = paired(
        loaded, loaded, SamplingSettings(temperature=0), SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, seed=5)
    )
    comparison.start(PROMPT)
    for _ in range(6):
        comparison.step()
    parted = comparison.parted_at
    assert parted is not None and len(comparison.diffs) > parted + 1
    for d in comparison.diffs:  # one model, one context (B on A's path after the parting): one raw distribution
        assert d.kl == pytest.approx(0.0, abs=1e-9) and d.top1_agree and d.a_rank_of_b >= 1
        assert d.teacher_forced == (d.index > parted)
        assert 0 < d.final_kl < math.inf  # what the settings change: greedy's one-hot against T=2's draw
    before = list(comparison.diffs)
    figures = comparison.running_figures
    comparison.rewind(2)
    assert comparison.diffs == before[: len(before) - 2]
    comparison.step()
    comparison.step()
    assert comparison.diffs == before  # the same steps again: the same differences
    # what a frame shows is kept as running sums, counted again where a rewind took counted steps: the full
    # statistics' own figures, and the same again after the rewind and the same steps
    full = comparison.statistics
    assert figures is not None and full is not None and comparison.running_figures == pytest.approx(figures)
    for name in ("count", "mean_kld", "same_top_p", "rms_dp", "ppl_ratio"):
        assert figures[name] == pytest.approx(full[name], rel=1e-9, abs=1e-12), name
    comparison.reset()
    assert comparison.diffs == before[:1]


def test_models_with_different_tokenizers_are_refused_in_one_line():
    other = tiny_model()
    tokenizer = copy.deepcopy(other.tokenizer)
    tokenizer.add_tokens(["<|new|>"])
    other = dataclasses.replace(other, tokenizer=tokenizer)
    with pytest.raises(TokenvizError, match="different tokenizers"):
        paired(tiny_model(), other, SamplingSettings(), SamplingSettings())


def test_compare_json_prints_both_journeys_and_their_diff(tmp_path, monkeypatch, capsys):
    model = save_tiny(tmp_path / "tiny")
    args = ("compare", PROMPT, "--model", model, "--temperature", "0", "--steps", "5")
    code, out, err = invoke(
        monkeypatch, capsys, *args, "--against", "temperature=1.5", "--against", "top-k=0", "--json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["settings"]["temperature"] == 0 and doc["b"]["settings"]["temperature"] == 1.5
    assert doc["b"]["settings"]["top_k"] == 0 and len(doc["a"]["steps"]) == 5
    assert [d["index"] for d in doc["diff"]] == list(range(min(len(doc["a"]["steps"]), len(doc["b"]["steps"]))))
    assert set(doc["diff"][0]) == {
        "index",
        "kl",
        "final_kl",
        "top1_agree",
        "a_rank_of_b",
        "b_rank_of_a",
        "teacher_forced",
        "nll_a",
        "nll_b",
        "kld",
        "dp",
        "a_top",
        "b_top",
    }
    assert doc["statistics"]["count"] == len(doc["diff"]) and doc["statistics"]["mean_kld"] == pytest.approx(
        0.0, abs=1e-4
    )
    a_ids = [s["chosen"]["id"] for s in doc["a"]["steps"]]
    b_ids = [s["chosen"]["id"] for s in doc["b"]["steps"]]
    expected = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), None)
    assert doc["parted_at"] == expected
    code, out, err = invoke(monkeypatch, capsys, *args, "--against-option", "dtype=bfloat16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["a"]["model"]["dtype"], doc["b"]["model"]["dtype"]) == ("float32", "bfloat16")
    assert 0 < doc["diff"][0]["kl"] < 0.1  # rounding, not another model
    code, out, err = invoke(monkeypatch, capsys, *args, "--json")
    assert code == 2 and "to differ" in err
    code, out, err = invoke(monkeypatch, capsys, *args, "--against", "temp=1", "--json")
    assert code == 2 and "NAME=VALUE" in err and "Traceback" not in err


def padded_model(seed: int = 1, extra: int = 64):
    """A tiny model sharing the tiny tokenizer, its vocabulary padded by `extra` ids, one of which
    (returned) it always prefers: a choice the other model has no id for."""
    from tokenviz.backends.transformers.model_description import model_info

    loaded = tiny_model(seed=seed)
    model = loaded.model
    n = model.config.vocab_size
    model.resize_token_embeddings(n + extra, mean_resizing=False)
    padding = n + extra - 1
    model.lm_head.register_forward_hook(lambda module, inputs, out: out.index_fill(-1, torch.tensor([padding]), 1e3))
    return dataclasses.replace(
        loaded, info=model_info(model, "tiny-padded", torch.device("cpu"), torch.float32)
    ), padding


def test_a_padded_vocabulary_is_compared_in_every_figure_and_saved(tmp_path):
    from tokenviz.files.journey_file import read_journey, recording_of
    from tokenviz.worker.comparing import save_comparison

    a_model, (b_model, padding) = tiny_model(seed=0), padded_model()
    greedy = SamplingSettings(temperature=0, max_new_tokens=4)
    comparison = paired(a_model, b_model, greedy, greedy)
    comparison.start(PROMPT)
    while comparison.step():
        pass
    a, b = comparison.sessions
    assert all(r.decision.chosen_id == padding for r in b.records)  # B picks an id A does not have
    for diff, ra, rb in zip(comparison.diffs, a.records, b.records, strict=False):
        context = a.ids[: ra.position] if diff.teacher_forced else b.ids[: rb.position]
        # (B's own forward: its padding's preference is a hook on the model, which a saved copy lacks)
        lb = eager_forward(b_model.model, context).logits[0, -1].double()
        assert diff.a_rank_of_b == a_model.model.config.vocab_size + 1  # past every token A has
        assert diff.b_rank_of_a == int((lb > lb[ra.decision.chosen_id]).sum()) + 1  # over B's whole vocabulary
        assert not diff.top1_agree and diff.kl >= 0
        assert diff.final_kl == math.inf  # greedy B's whole mass is on the id A has not: no finite KL
    written = save_comparison(comparison, str(tmp_path / "padded"))
    document = json.loads((tmp_path / "padded.json").read_text())
    assert len(written) == 3 and document["diff"][0]["a_rank_of_b"] == a_model.model.config.vocab_size + 1
    replayed = recording_of(read_journey(tmp_path / "padded-b.json")).snapshot
    assert replayed.records[-1].decision.chosen_id == padding
