"""The grammar in the app: G sets, changes and clears it live; the sampling pane shows its stage (the
tokens allowed, the mass removed, the forbidden candidates struck through, a forced token)."""

import re

from apptools import answer_dialog, make_app, settle, wait_for

from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.screens import GrammarDialog


async def set_grammar(app, pilot, line: str) -> None:
    await answer_dialog(app, pilot, "G", GrammarDialog, line)


def sampling_text(app) -> str:
    return str(app.query_one(SamplingPane).content)


async def test_g_sets_a_grammar_the_pane_shows_its_stage_and_autoplay_stops_when_it_is_complete():
    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        before = await settle(app, pilot)
        assert before.settings.grammar is None and "grammar" not in sampling_text(app)
        await set_grammar(app, pilot, "regex [0-9]{3}")
        s = await settle(app, pilot)
        assert s.settings.grammar is not None and s.settings.grammar.text == "[0-9]{3}"
        stage = next(st for st in s.records[-1].decision.stages if st.is_grammar)
        assert stage.kept < s.info.vocab and stage.removed > 0  # a random model puts mass on letters too
        text = sampling_text(app)
        assert f"{stage.kept:,} allowed, {stage.removed:.1%} of the mass removed" in text
        assert "✗" in text  # the model's strongest forbidden candidates, struck through
        assert s.records[-1].decision.chosen_text.isdigit()
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot, timeout=30)
        s = await settle(app, pilot)
        assert s.stop_reason == "the grammar is complete" and re.fullmatch("[0-9]{3}", s.text)


async def test_a_single_allowed_token_is_shown_as_forced_and_off_clears_the_grammar():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await set_grammar(app, pilot, "regex abc")
        await settle(app, pilot)
        assert "forced: the only token allowed" in sampling_text(app)
        await set_grammar(app, pilot, "off")
        s = await settle(app, pilot)
        assert s.settings.grammar is None and not any(st.is_grammar for st in s.records[-1].decision.stages)
        assert "grammar" not in sampling_text(app)


async def test_a_grammar_the_text_leaves_or_a_wrong_file_is_one_message_and_nothing_changes(tmp_path):
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        before = await settle(app, pilot)
        assert not before.text[:1].isdigit()  # (the tiny model's greedy path: not a digit)
        await set_grammar(app, pilot, "regex [0-9]+")
        await wait_for(lambda: any("leaves the grammar" in str(n.message) for n in app._notifications), pilot)
        s = await settle(app, pilot)
        assert s.settings == before.settings and s.records == before.records
        (tmp_path / "bad.json").write_text("{not json")
        await set_grammar(app, pilot, str(tmp_path / "bad.json"))
        await wait_for(lambda: any("is not JSON" in str(n.message) for n in app._notifications), pilot)
        assert app.journey.snapshot.settings == before.settings


async def test_a_saved_journey_keeps_its_grammar_and_replay_shows_the_stage(tmp_path):
    from apptools import recorded_app

    from tokenviz.contract.commands import Save
    from tokenviz.files.journey_file import read_journey, recording_of

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=20))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await set_grammar(app, pilot, "regex [0-9]{2}x")
        await settle(app, pilot)
        await pilot.press("space")
        live = await settle(app, pilot)
        shown = sampling_text(app)
        app.journey.submit(Save(str(tmp_path / "j.json")))
        await settle(app, pilot)
    recording = recording_of(read_journey(tmp_path / "j.json"))
    assert recording.snapshot.settings.grammar == live.settings.grammar
    replay = recorded_app(recording)
    async with replay.run_test(size=(160, 48)) as pilot:
        await settle(replay, pilot)
        assert "grammar regex [0-9]{2}x:" in sampling_text(replay) and sampling_text(replay) == shown


async def test_the_chosen_token_keeps_its_row_below_the_forbidden_candidates():
    """However few rows the pane has, the chosen token's row is among them (after the strongest
    candidates, struck through where the grammar forbids them), as the next-token pane pins it."""
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(app, pilot)
        await set_grammar(app, pilot, "regex [0-9]{3}")
        s = await settle(app, pilot)
        d = s.records[-1].decision
        assert d.chosen_text.isdigit() and d.raw_rank > 10  # (the tiny model puts its mass on letters)
        rows = [line for line in sampling_text(app).splitlines() if line[:1] in "▶✗ " and "token" not in line]
        assert rows and sum(line.startswith("✗") for line in rows) >= 1
        assert sum(line.startswith("▶") for line in rows) == 1 and rows[-1].startswith(f"▶{d.chosen_text}")
