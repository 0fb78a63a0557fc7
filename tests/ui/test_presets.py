"""Task presets (issue 51, item 12): the source texts' settings by task, one key each (F1-F3) and
--preset NAME headless; the sampling pane names the preset in force; the palette finds every setting
by name and each preset by its task."""

from __future__ import annotations

import json

import pytest
from apptools import make_app, settle, wait_for
from clitools import invoke
from tiny import save_tiny

from tokenviz.contract.presets import BY_NAME, preset_in_force, with_preset
from tokenviz.contract.settings import DEFAULT_SETTINGS, SamplingSettings
from tokenviz.decoding.nudges import adjust
from tokenviz.ui.panes.sampling import SamplingPane

CREATIVE = {"temperature": 1.0, "top_p": 0.95, "frequency_penalty": 0.3, "top_k": 0, "min_p": 0.0}


def test_a_preset_sets_its_tasks_settings_and_is_named_only_while_they_hold():
    creative = adjust(DEFAULT_SETTINGS.replace(seed=7, max_new_tokens=9), "creative")
    assert {k: getattr(creative, k) for k in CREATIVE} == CREATIVE
    assert (creative.seed, creative.max_new_tokens) == (7, 9)  # the journey's own, untouched
    assert preset_in_force(creative) is BY_NAME["creative"]
    assert preset_in_force(adjust(creative, "temperature", -1)) is None
    factual = with_preset(DEFAULT_SETTINGS, BY_NAME["factual"])
    assert (factual.temperature, factual.top_p, factual.top_k) == (0.2, 0.9, 0)
    assert preset_in_force(DEFAULT_SETTINGS) is None  # (the default keeps top-k 50: not the texts' balanced)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny-presets"), "llama", context=64)


def test_trace_preset_runs_the_texts_settings_and_says_so(monkeypatch, capsys, tiny_dir):
    args = ["--model", tiny_dir, "--steps", "3", "--dtype", "float32", "--device", "cpu", "--json"]
    code, out, err = invoke(monkeypatch, capsys, "trace", "The cat sat", *args, "--preset", "creative")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["preset"] == "creative"
    for step in [{"settings": doc["settings"]}, *doc["steps"]]:
        assert {k: step["settings"][k] for k in CREATIVE} == CREATIVE
    code, out, err = invoke(
        monkeypatch, capsys, "trace", "The cat sat", *args, "--preset", "creative", "--temperature", "0.7"
    )
    doc = json.loads(out)
    assert code == 0 and doc["settings"]["temperature"] == 0.7 and doc["settings"]["top_p"] == 0.95
    assert doc["preset"] is None  # (an option given beside it wins: the settings are no preset's)
    code, _, err = invoke(monkeypatch, capsys, "trace", "The cat sat", *args, "--preset", "poetic")
    assert code == 2 and "--preset takes factual, balanced, creative; got 'poetic'" in err


async def test_f3_sets_the_creative_preset_and_the_palette_finds_settings_and_presets():
    from tokenviz.ui.command_palette import TokenvizCommands

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("f3")
        await wait_for(lambda: app.journey.snapshot.settings.temperature == 1.0, pilot)
        s = app.journey.snapshot.settings
        assert {k: getattr(s, k) for k in CREATIVE} == CREATIVE
        await wait_for(lambda: "preset creative" in str(app.query_one(SamplingPane).border_subtitle), pilot)
        provider = TokenvizCommands(app.journey)
        for query, expected in (("temperature", "Temperature up (T)"), ("creative", "Preset: creative (F3)")):
            hits = [str(hit.text) async for hit in provider.search(query)]
            assert any(expected in h for h in hits), (query, hits)


@pytest.mark.terminal
def test_f1_and_f3_in_a_real_terminal_at_80x24(tiny_dir):
    """The function keys as a terminal sends them (tmux), and the preset named in the sampling pane."""
    from terminals import keys, quits_cleanly, terminal, wait_screen

    with terminal((80, 24), "The cat sat", "--model", tiny_dir, "--temperature", "0") as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "F3")
        wait_screen(name, r"T 1\.00 .*preset creative")
        keys(name, "F1")
        wait_screen(name, r"T 0\.20 .*preset factual")
        quits_cleanly(name)


async def test_any_setting_is_typed_with_equals_and_a_mistake_changes_nothing():
    from apptools import answer_dialog
    from textual.widgets import Input

    from tokenviz.ui.screens import SettingsDialog

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await answer_dialog(app, pilot, "equals_sign", SettingsDialog, "temperature=0.3 top-k=0 presence-penalty=0.5")
        await wait_for(lambda: app.journey.snapshot.settings.temperature == 0.3, pilot)
        s = app.journey.snapshot.settings
        assert (s.top_k, s.presence_penalty) == (0, 0.5)
        for typo, said in (("temperature=hot", "temperature must be a number"), ("top_kk=3", "top-k, top-p")):
            # (issue 69, finding 12: a typo closed the dialog and lost the text; the line named top_k)
            await answer_dialog(app, pilot, "equals_sign", SettingsDialog, typo)
            await wait_for(lambda: said in str(app.screen.query_one("#ask-error").render()), pilot)  # noqa: B023
            assert isinstance(app.screen, SettingsDialog) and app.screen.query_one(Input).value == typo
            await pilot.press("escape")
            await wait_for(lambda: not isinstance(app.screen, SettingsDialog), pilot)
            assert app.journey.snapshot.settings == s


@pytest.mark.terminal
def test_a_past_steps_subtitle_shows_the_settings_it_was_decided_with_at_80x24(tiny_dir):
    """(Issue 69, finding 1: after F3, the cursor on a step decided before it showed the creative preset's
    settings in the sampling pane's subtitle as if they had decided it.) They are said to be the settings
    from now on there; on the pending step, decided with them, they are the step's own."""
    from terminals import keys, quits_cleanly, terminal, wait_screen

    with terminal((80, 24), "The cat sat", "--model", tiny_dir, "--temperature", "0.7") as name:
        wait_screen(name, r"ready · step 0")
        keys(name, "Space", "Space")
        wait_screen(name, r"step 2")
        keys(name, "F3")
        wait_screen(name, r"T 1\.00 .*preset creative")
        keys(name, "Left", "Left")
        text = wait_screen(name, r"now: T 1\.00")
        assert all("now: " in line for line in text.splitlines() if "preset creative" in line), text
        keys(name, "Right", "Right")  # (the pending step, decided with the preset: no "now")
        text = wait_screen(name, r"─ T 1\.00 .*preset creative")
        assert "now: " not in text, text
        quits_cleanly(name)


def test_preset_equals_a_name_sets_a_tasks_settings_among_typed_ones_and_a_setting_beside_it_wins():
    from tokenviz.contract.errors import SettingsError
    from tokenviz.contract.presets import assigned

    creative = assigned(DEFAULT_SETTINGS, ["preset=creative"])
    assert preset_in_force(creative) is BY_NAME["creative"]
    assert assigned(DEFAULT_SETTINGS, ["top-p=0.5", "preset=Creative"]).top_p == 0.5  # (named beside it: wins)
    with pytest.raises(SettingsError, match=r"preset= takes factual, balanced, creative; got 'wild'"):
        assigned(DEFAULT_SETTINGS, ["preset=wild"])
    with pytest.raises(SettingsError, match=r"or preset=factual\|balanced\|creative"):
        assigned(DEFAULT_SETTINGS, ["warmth=2"])
