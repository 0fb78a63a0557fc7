"""Why does the output look like this? (issue 51, item 13): each symptom of the source texts' table, read
off what the journey measured, with its evidence by position and the remedy the settings offer."""

from __future__ import annotations

import json

import pytest
from clitools import invoke
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.diagnosis import LOOP, diagnose
from tokenviz.journey.session import Session


def journey(settings: SamplingSettings) -> Session:
    session = Session(ModelRunner(tiny_model("llama", 128)), settings)
    session.start("The cat sat on the mat")
    while session.step() is not None:
        pass
    return session


def symptoms_of(session: Session) -> dict:
    text = session.engine.decode(session.ids[len(session.prompt_ids) :])
    found = diagnose(
        session.records,
        session.ids,
        len(session.prompt_ids),
        text,
        session.stop_reason,
        session.settings,
        session.engine.piece,
    )
    return {s.symptom: s for s in found}


def test_a_greedy_loop_is_found_where_it_comes_back_with_the_steps_it_won():
    session = journey(SamplingSettings(temperature=0, max_new_tokens=60))
    found = symptoms_of(session)
    loop = found["repetitive"]
    assert loop.cause == "a low temperature and no penalty" and "frequency penalty" in loop.remedy
    at = loop.evidence["at"]
    runs = {tuple(session.ids[a : a + LOOP]) for a in at}
    assert len(at) >= 2 and len(runs) == 1  # the same run of tokens at every position named
    for won in loop.evidence["loop_won"]:
        record = session.records[won["position"] - len(session.prompt_ids)]
        assert won["rank"] == record.decision.raw_rank and won["raw_p"] == record.decision.raw_prob
    penalised = journey(SamplingSettings(temperature=0, max_new_tokens=60, frequency_penalty=1.5))
    assert symptoms_of(penalised).get("repetitive") is None or (
        symptoms_of(penalised)["repetitive"].cause == "the model's own loop"
    )


def test_hot_draws_far_down_the_ranking_are_listed_every_one():
    session = journey(SamplingSettings(temperature=2.0, top_k=0, top_p=1.0, max_new_tokens=30, seed=3))
    far = symptoms_of(session)["inconsistent or incoherent"]
    listed = {s["position"] for s in far.evidence["steps"]}
    expected = {r.position for r in session.records[:30] if r.decision.raw_rank > 10}
    assert listed == expected and listed
    assert "lower the temperature" in far.remedy
    calm = journey(SamplingSettings(temperature=0.7, max_new_tokens=30, seed=3))
    assert "inconsistent or incoherent" not in symptoms_of(calm)


def test_a_draw_far_down_the_ranking_is_the_symptom_at_any_temperature():
    """At 1.0 with the creative preset, the text went astray at a token of raw rank 3,916 and p 1.5e-05, and
    y said none of the symptoms was found: the check fired only above a temperature of 1."""
    from tokenviz.journey.diagnosis import VERY_FAR

    session = journey(SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=40, seed=5))
    expected = {r.position for r in session.records[:40] if r.decision.raw_rank > VERY_FAR}
    assert expected, "no draw past rank 100 in this journey: another seed"
    far = symptoms_of(session)["inconsistent or incoherent"]
    assert {s["position"] for s in far.evidence["steps"]} == expected
    assert f"past rank {VERY_FAR}" in far.cause and "top-p 0.9 or top-k 50" in far.remedy


def test_the_least_sure_steps_show_the_digits_that_matter():
    """A step drawn at p 1.5e-05 was listed as p 0.000."""
    import dataclasses

    from tokenviz.ui.panes.why import least_sure_text
    from tokenviz.worker.snapshots import snapshot_of

    session = journey(SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=10, seed=5))
    snapshot = snapshot_of(session)
    first = snapshot.records[0]  # (the tiny model's own probabilities are near 1/V: one made as the review saw it)
    unlikely = dataclasses.replace(first, decision=dataclasses.replace(first.decision, raw_prob=1.5e-05))
    snapshot = dataclasses.replace(snapshot, records=(unlikely, *snapshot.records[1:]))
    shown = least_sure_text(snapshot, "blue").plain
    assert " p 1.5e-05 · " in shown and " p 0.000 " not in shown, shown


@pytest.mark.parametrize(
    "low, high, digits",
    [(0.1, 0.5, 4), (0.99931, 0.99937, 5), (0.5, 0.5000004, 7), (0.3, 0.3, 4)],
)
def test_a_draws_band_has_the_digits_that_make_it_an_interval(low, high, digits):
    from tokenviz.render.units import draw_digits

    n = draw_digits(low, high)
    assert n == digits and (low == high or f"{low:.{n}f}" != f"{high:.{n}f}")


@pytest.mark.bundled
def test_trace_names_the_new_token_limit_as_the_cause_of_a_cut_text(monkeypatch, capsys):
    """The issue's done-when, on the bundled model."""
    args = ("--steps", "8", "--temperature", "0", "--json")
    code, out, err = invoke(monkeypatch, capsys, "trace", "The Eiffel Tower is located in", *args)
    assert code == 0, err
    doc = json.loads(out)
    cut = [d for d in doc["diagnosis"] if d["symptom"] == "cut off mid-sentence"]
    assert cut and cut[0]["cause"] == "the new-token limit" and cut[0]["evidence"]["limit"] == 8
    assert cut[0]["evidence"]["new_tokens"] == len(doc["steps"]) == 8  # (issue 69, finding 9: both new tokens)
    assert doc["text"].endswith(cut[0]["evidence"]["ends_with"])
    code, out, err = invoke(
        monkeypatch,
        capsys,
        "trace",
        "The Eiffel Tower is located in",
        "--steps",
        "8",
        "--stop",
        ",",
        "--temperature",
        "0",
        "--json",
    )
    assert code == 0 and not [d for d in json.loads(out)["diagnosis"] if d["symptom"] == "cut off mid-sentence"]


@pytest.mark.bundled
def test_the_trace_table_says_why_under_the_text(monkeypatch, capsys):
    code, out, _ = invoke(
        monkeypatch, capsys, "trace", "The Eiffel Tower is located in", "--steps", "8", "--temperature", "0"
    )
    assert code == 0 and "why cut off mid-sentence: the new-token limit; raise the new-token limit" in out, out


async def test_the_status_line_says_why_once_the_journey_stops():
    from apptools import make_app, settle, wait_for

    from tokenviz.ui.panes.status import StatusLine

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60))
    async with app.run_test(size=(200, 60)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot, timeout=60)
        await wait_for(lambda: "why: " in str(app.query_one(StatusLine).render()), pilot)
        line = str(app.query_one(StatusLine).render())
        why = [symptom.brief for symptom in app.journey.snapshot.why]
        assert f"why: {why[0]}" in line and "repetitive (a low temperature and no penalty)" in why, (line, why)


async def test_y_opens_every_symptom_with_its_evidence_and_remedy_once_the_journey_stops():
    """Issue 51, item 13: a view of the diagnosis beside the status line's first symptom: each symptom,
    its cause, the evidence by position and the remedy, the same trace --json gives."""
    from apptools import make_app, settle, wait_for

    from tokenviz.ui.panes.why import WhyPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("y")
        pane = app.query_one(WhyPane)
        await wait_for(lambda: "Once the journey stops" in str(pane.body.render()), pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot, timeout=60)
        await wait_for(lambda: "remedy:" in str(pane.body.render()), pilot)
        shown = str(pane.body.render())
        for symptom in app.journey.snapshot.why:
            assert f"{symptom.symptom}\n  cause: {symptom.cause}" in shown and f"remedy: {symptom.remedy}" in shown
        loop = next(s for s in app.journey.snapshot.why if s.symptom == "repetitive")
        first_win = loop.evidence["loop_won"][0]
        assert f"@{first_win['position']} #{first_win['rank']} p {first_win['raw_p']:.3f}" in shown
