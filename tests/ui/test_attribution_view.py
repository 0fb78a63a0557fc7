"""The attribution view: A explains the token after the cursor, strongest first, shades the chips
by it and follows the cursor; the palette switches to gradient × input; a recording says why not."""

import dataclasses

import pytest
from apptools import frozen_recording, make_app, recorded_app, settle, wait_for

from tokenviz.contract.commands import Attribute
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.keys import JOURNEY_OWNERS, routed
from tokenviz.ui.panes import attribution
from tokenviz.ui.panes.tokens import TokensPane


@pytest.fixture(autouse=True)
def never_too_long(monkeypatch):
    """These tests are of attribution itself: on a loaded machine the estimate from a slow prefill may
    pass the long-job bound, whose question is tested in test_long_jobs."""
    monkeypatch.setattr(attribution, "LONG_JOB_S", float("inf"))


async def test_a_explains_the_token_after_the_cursor_and_shades_the_chips():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20))
    async with app.run_test(size=(120, 36)) as pilot:
        s = await settle(app, pilot)
        await pilot.press("A")
        await wait_for(lambda: app.journey.snapshot.result(Attribute) is not None, pilot)
        await settle(app, pilot)
        a = app.journey.snapshot.result(Attribute)
        cursor = app.journey.current_selection().cursor
        assert a.method == "loo" and a.position == cursor and a.target_id == s.pending.decision.chosen_id
        shown = str(app.query_one("#attribution").body.render())
        strongest = a.strongest(1)[0]
        assert "why" in shown and "leave-one-out" in shown and f"@{strongest}" in shown
        tokens = app.query_one(TokensPane)
        assert tokens.attribution is a and "shaded by attribution" in str(tokens.border_subtitle)
        await pilot.press("left")  # the cursor moves: the token after it is explained instead
        await wait_for(lambda: app.journey.snapshot.result(Attribute).position == cursor - 1, pilot)
        await app.journey.run_action(routed("attribution('grad')", JOURNEY_OWNERS))
        await wait_for(lambda: app.journey.snapshot.result(Attribute).method == "grad", pilot)
        await settle(app, pilot)
        assert "gradient × input" in str(app.query_one("#attribution").body.render())
        await pilot.press("A")  # again: back to the attention map, and the chips lose the shading
        await settle(app, pilot)
        assert app.query_one("#views").current == "attention" and tokens.attribution is None


async def test_a_recording_says_attribution_needs_the_model():
    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("A")
        await pilot.pause(0.2)
        assert "it needs the model" in str(app.query_one("#attribution").body.render())


@pytest.mark.parametrize("method", ["loo", "grad"])
def test_both_methods_are_offered_in_the_palette(method):
    from tokenviz.ui.keys import PALETTE_ONLY

    assert any(entry[1] == f"attribution('{method}')" for entry in PALETTE_ONLY)


async def test_a_saved_journey_keeps_its_attributions_and_replay_shows_them(tmp_path):
    from tokenviz.contract.commands import Save
    from tokenviz.files.journey_file import read_journey, recording_of

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "A")
        await wait_for(lambda: app.journey.snapshot.result(Attribute) is not None, pilot)
        await app.journey.run_action(routed("attribution('grad')", JOURNEY_OWNERS))
        await wait_for(lambda: app.journey.snapshot.result(Attribute).method == "grad", pilot)
        computed = app.journey.snapshot.result(Attribute)
        app.journey.submit(Save(str(tmp_path / "j.json")))
        await settle(app, pilot)
    recording = recording_of(read_journey(tmp_path / "j.json"))
    assert {a.method for a in recording.analyses.attributions} == {"loo", "grad"}
    assert computed in recording.analyses.attributions  # every figure as computed
    replay = recorded_app(recording)
    async with replay.run_test(size=(120, 36)) as pilot:
        await settle(replay, pilot)
        await pilot.press("A")
        await wait_for(lambda: replay.journey.snapshot.result(Attribute) is not None, pilot)
        await settle(replay, pilot)
        assert (
            replay.journey.snapshot.result(Attribute).method == "loo"
            and replay.journey.snapshot.result(Attribute).position == computed.position
        )
        assert "why" in str(replay.query_one("#attribution").body.render())
        await replay.journey.run_action(routed("attribution('grad')", JOURNEY_OWNERS))
        await wait_for(lambda: replay.journey.snapshot.result(Attribute) == computed, pilot)
        await pilot.press("left")  # a position nothing was kept for: the view says so, no error
        await settle(replay, pilot)
        assert replay.journey.snapshot.result(Attribute) is None and replay.journey.snapshot.error is None
        assert "it needs the model" in str(replay.query_one("#attribution").body.render())


def test_a_damaged_attribution_in_a_file_is_refused_in_one_line(tmp_path):
    import json

    from apptools import frozen_recording

    from tokenviz.contract.errors import TokenvizError
    from tokenviz.contract.results import Analyses, Attribution
    from tokenviz.files.journey_file import journey_file, parse_journey

    snapshot, attention, _ = frozen_recording(steps=2)
    good = Attribution("loo", 2, snapshot.chips[3].id, "x", -1.5, (0.1, -0.2, 0.3))
    doc = json.loads(json.dumps(journey_file(snapshot, attention, Analyses(attributions=(good,)))))
    assert parse_journey(doc).replay.attributions == (good,)  # the record itself, as it was saved
    doc["replay"]["attributions"][0]["scores"] = [0.1]
    with pytest.raises(TokenvizError, match="scores"):
        parse_journey(doc)


async def test_the_next_estimate_follows_the_speed_measured_here():
    """The first estimate is the prefill's speed; once a leave-one-out has run here (long enough to
    time), the next is that run's seconds scaled by the work: the square of the tokens."""
    from tokenviz.ui.panes.attribution import AttributionPane, estimated_s

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20), step_seconds=0.6)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        screen = app.journey
        pane = screen.query_one(AttributionPane)
        assert pane.measured == {}
        await pilot.press("A")
        await wait_for(lambda: "loo" in pane.measured, pilot, timeout=60)
        tokens, seconds = pane.measured["loo"]
        selection = screen.current_selection()
        assert tokens == selection.cursor + 1 and seconds >= 1.0  # two passes of 0.6 s at least
        fewer = dataclasses.replace(selection, cursor=selection.cursor // 2)
        n = fewer.cursor + 1
        expected = seconds * (n + 1) * n / ((tokens + 1) * tokens)
        assert estimated_s(fewer, "loo", pane.measured["loo"]) == pytest.approx(expected)
        assert estimated_s(fewer, "loo", None) != pytest.approx(expected)  # (the prefill's, before)


async def test_the_page_saved_from_the_app_shows_the_lens_where_it_was_computed(tmp_path):
    """Issue 69, finding 10: the page had no lens. Saved from the app (x, Save with the page's colours),
    the page holds the lens at each position of the current path it was computed at, as computed."""
    import json
    import re

    from tokenviz.contract.commands import Inspect, Save
    from tokenviz.ui.colors import page_colors
    from tokenviz.ui.themes import DEFAULT_THEME, load_themes

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "l")
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        shown = app.journey.snapshot.result(Inspect)
        colors = page_colors(load_themes()[DEFAULT_THEME])
        app.journey.submit(Save(str(tmp_path / "j.json"), page_colors=colors))
        await wait_for(lambda: (tmp_path / "j.html").exists(), pilot)
    page = (tmp_path / "j.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    rows = data["lens"][str(shown.position)]
    assert list(data["lens"]) == [str(shown.position)]  # (the one position it was computed at)
    assert [r[0] for r in rows] == [layer.layer for layer in shown.lens]
    assert [r[1] for r in rows] == [layer.top[0][0] for layer in shown.lens]
    assert [r[4] for r in rows] == [layer.chosen_rank for layer in shown.lens]


def test_a_first_estimate_is_timed_by_the_steps_not_a_cold_prefill_alone():
    """UX 7's finding 11: over 10 tokens the chooser said leave-one-out would take "about 1 min 41 s" and
    gradient × input "about 33 s" (it took 4.2 s): the estimate divided by the first prefill's speed, which
    carries the start's warm-up. A pass is timed by the steps: here (a 7-token prefill of 2 s, steps of 30
    ms) 10 tokens' leave-one-out is 11 passes of at most 300 ms, under the 10 s that asks first."""
    from types import SimpleNamespace

    from tokenviz.ui.panes.attribution import LONG_JOB_S, estimated_s

    prefill = SimpleNamespace(forward_ms=2000.0, input_ids=tuple(range(7)))
    steps = [SimpleNamespace(forward_ms=30.0, input_ids=(1,)) for _ in range(4)]
    selection = SimpleNamespace(cursor=9, snapshot=SimpleNamespace(records=[prefill, *steps]))
    loo, grad = estimated_s(selection, "loo"), estimated_s(selection, "grad")
    assert loo == pytest.approx(11 * 0.3) and loo < LONG_JOB_S and grad == pytest.approx(3 * 0.3)
    unstepped = SimpleNamespace(cursor=9, snapshot=SimpleNamespace(records=[prefill]))
    assert estimated_s(unstepped, "loo") == pytest.approx(11 * 10 * 2000 / 7 / 1000)  # (no step yet: the prefill's)
