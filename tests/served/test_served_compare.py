"""`compare --against-backend server` in a terminal: the comparison screen with the model a real vLLM server runs
as B (tests/served/conftest.py), its figures those of the headless comparison (`--json`), every number
labelled for what it is (the KL over the server's top N; what the server draws from, unknown)."""

from __future__ import annotations

import json
import math

import pytest
from clitools import invoke
from test_served import KEY_ENV, PROMPT

from tokenviz.backends.served.completions import REPRODUCED_WITHIN, ServedChoice
from tokenviz.backends.served.engine import ServedEngine
from tokenviz.backends.shared.endpoint import ApiKey
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.cli.commands import in_terminal
from tokenviz.contract.settings import SamplingSettings
from tokenviz.decoding.perplexity_statistics import KLD_NOT_GIVEN
from tokenviz.files.record_json import step_diff_json
from tokenviz.journey.drawn_comparison import DrawnComparison
from tokenviz.journey.session import Session

pytestmark = [pytest.mark.served, pytest.mark.bundled]


def pair(vllm_server, bundled, settings: SamplingSettings) -> DrawnComparison:
    server = ServedEngine.open(ServedChoice(vllm_server.url, api_key=ApiKey(env=KEY_ENV)))
    return DrawnComparison(Session(ModelRunner(bundled), settings), Session(server, settings))


def test_the_screens_figures_are_the_headless_comparisons(vllm_server, bundled, monkeypatch, capsys):
    """Greedy, the bundled model here (float32) beside the server's copy: the steps' KL over the server's
    top 20, top-1 and ranks equal those `compare --against-backend server --json` gives; the KL of what the
    draws are made from is unknown (NaN), never 0."""
    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    greedy = SamplingSettings(temperature=0, max_new_tokens=5)
    comparison = pair(vllm_server, bundled, greedy)
    comparison.start(PROMPT)
    while comparison.step():
        pass
    assert comparison.parted_at is None and not comparison.independent_draws and "top 20" in comparison.kl_over
    code, out, err = invoke(monkeypatch, capsys, "compare", PROMPT, "--against-backend", "server",
                            "--endpoint", vllm_server.url, "--api-key-env", KEY_ENV, "--steps", "5",
                            "--temperature", "0", "--json")  # fmt: skip
    assert code == 0, err
    headless = json.loads(out)["diff"]
    assert len(comparison.diffs) == len(headless) == 5
    for shown, told in zip(comparison.diffs, headless, strict=True):
        assert shown.kl == pytest.approx(told["kl"], abs=1e-6)
        assert (shown.top1_agree, shown.a_rank_of_b, shown.b_rank_of_a) == (
            told["top1_agree"], told["a_rank_of_b"], told["b_rank_of_a"],
        )  # fmt: skip
        assert math.isnan(shown.final_kl) and step_diff_json(shown)["final_kl"] is None
    # llama-perplexity's figures a top N allows, B the base: the server's log-probability of A's token at each
    # step (its prompt_logprobs, asked outside the comparison); the KLD, a sum over every token, not given
    a, steps = comparison.a, len(comparison.diffs)
    said = comparison.server.prompt_logprobs(list(a.ids[: len(a.prompt_ids) + steps]), 0)
    for d, record in zip(comparison.diffs, a.records, strict=True):
        token = record.decision.chosen_id
        assert d.nll_b == pytest.approx(-said[record.position][token][0], abs=REPRODUCED_WITHIN)
        assert d.dp == pytest.approx(math.exp(-d.nll_a) - math.exp(-d.nll_b), abs=1e-9) and math.isnan(d.kld)
    statistics = json.loads(out)["statistics"]
    assert (
        statistics["mean_kld"] is None and statistics["max_kld"] is None and statistics["not_given"] == [KLD_NOT_GIVEN]
    )
    assert statistics["count"] == 5 and statistics["same_top_p"] == sum(t["top1_agree"] for t in headless) / 5
    nll = [(t["nll_a"], t["nll_b"]) for t in headless]
    assert statistics["ppl_ratio"] == pytest.approx(math.exp(sum(x - y for x, y in nll) / 5), rel=1e-6)


def test_after_the_paths_part_b_is_asked_at_as_context(vllm_server, bundled, monkeypatch):
    """Sampled hot on both sides, the draws part; a row after it is B's top N at A's own context
    (teacher-forced): its KL and ranks those of a request there (asked again: within the server's own
    reproducibility)."""
    from tokenviz.journey.comparison import rank_in
    from tokenviz.journey.drawn_comparison import kl_over

    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    hot = SamplingSettings(temperature=1.5, top_k=0, top_p=1.0, seed=3, max_new_tokens=12)
    comparison = pair(vllm_server, bundled, hot)
    comparison.start(PROMPT)
    while not comparison.diffs[-1].teacher_forced:
        assert comparison.step(), "the draws never parted"
    assert comparison.independent_draws and comparison.parted_at is not None
    row, a = comparison.diffs[-1], comparison.a
    logits = a.pending_logits.reshape(-1)
    drawn = comparison.server.draw(list(a.ids), comparison.b.settings)
    top = dict(drawn.top)
    assert row.kl == pytest.approx(kl_over(logits, top), abs=REPRODUCED_WITHIN)
    assert row.a_rank_of_b == rank_in(logits, drawn.chosen)  # (the same seeded draw: see test_served_app)
    assert row.top1_agree == (int(logits.argmax()) == max(top, key=top.__getitem__))


async def test_compare_against_an_endpoint_in_a_terminal_opens_the_comparison_screen(
    vllm_server, monkeypatch, capsys, tmp_path
):
    """Where the app can draw, `compare --against-backend server` opens the comparison screen (it had
    printed a table and ended); the screen says over what its KL is taken and shows the unknown as —, and so does
    the comparison it saves."""
    from apptools import wait_for

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.ui.compare_screen import CompareScreen, DiffPane

    monkeypatch.setenv(KEY_ENV, vllm_server.key)
    opened = []

    def run_app(worker, theme, comparing=False):
        opened.append((worker, comparing))
        raise SystemExit(0)

    monkeypatch.setattr(in_terminal, "can_draw", lambda: True)
    monkeypatch.setattr(in_terminal, "run_app", run_app)
    code, out, err = invoke(monkeypatch, capsys, "compare", PROMPT, "--against-backend", "server",
                            "--endpoint", vllm_server.url, "--api-key-env", KEY_ENV, "--steps", "4",
                            "--temperature", "0")  # fmt: skip
    assert code == 0 and out == "", err  # (no table: the screen)
    ((worker, comparing),) = opened
    assert comparing
    app = TokenvizApp(worker, comparing=True)  # (the worker the command made: A loaded here, B the server)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(lambda: isinstance(app.screen, CompareScreen), pilot)
        screen = app.screen
        await wait_for(lambda: screen.snapshot is not None and screen.snapshot.diffs, pilot, timeout=120)
        await pilot.press("space", "space")
        await wait_for(lambda: len(screen.snapshot.diffs) == 3, pilot, timeout=120)
        await pilot.pause(0.2)
        shown = str(app.query_one(DiffPane).render())
        assert "KL over the server's top 20" in shown and "KL top-N" in shown and "—" in shown
        assert "∞" not in shown and vllm_server.key not in shown
        monkeypatch.chdir(tmp_path)
        await pilot.press("x")
        await wait_for(lambda: len(list(tmp_path.glob("tokenviz-compare*.json"))) == 3, pilot, timeout=60)
    (document,) = [p for p in tmp_path.glob("tokenviz-compare*.json") if not p.stem.endswith(("-a", "-b"))]
    saved = json.loads(document.read_text())
    assert "top 20" in saved["kl_over"] and all(d["final_kl"] is None for d in saved["diff"])
    assert vllm_server.key not in document.read_text()
