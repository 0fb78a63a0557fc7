"""The app under Pilot: every key, what it changes and what the panes then show."""

import signal
import time

import numpy as np
import pytest
from apptools import PROMPT, burst, enter_prompt, make_app, settle, wait_for
from closeness import assert_close
from textual.command import CommandList, CommandPalette
from textual.widgets import Checkbox, Input, OptionList, TextArea
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.attention import window
from tokenviz.contract.commands import Beams, Inspect, ShowAttention, Speculate
from tokenviz.contract.settings import SamplingSettings
from tokenviz.journey.session import Session
from tokenviz.render.units import probability
from tokenviz.ui.panes.attention import AttentionPane
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.sampling import SamplingPane
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.screens import HelpScreen, PromptScreen


def shown(app, pane) -> str:
    widget = app.query_one(pane)
    if pane is AttentionPane:
        body = "\n".join(widget.render_line(y).text for y in range(widget.size.height))
        return f"{widget.border_title}\n{body}"
    content = widget.content
    rendered = app.console.render_lines(content, app.console.options.update_width(widget.size.width or 80))
    text = "\n".join("".join(seg.text for seg in line) for line in rendered)
    return f"{widget.border_title}\n{text}\n{widget.border_subtitle}"


async def test_first_frame_then_prefill(tmp_path):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        s = await settle(app, pilot)
        assert s.state == "ready" and s.prompt_len == len(s.chips) > 0
        tokens = shown(app, TokensPane)
        for chip in s.chips:
            assert str(chip.id) in tokens
        assert "next:" in tokens
        assert "layer 2 of 3" in shown(app, AttentionPane)
        assert "entropy" in shown(app, NextTokenPane)
        assert "draw u =" in shown(app, SamplingPane)
        assert "ready" in str(app.query_one(StatusLine).render())


async def test_the_attention_pane_shows_the_exact_rows_the_worker_computed_for_it():
    app = make_app(SamplingSettings(seed=3, max_new_tokens=1000))
    async with app.run_test(size=(120, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press(*["space"] * 12)
        s = await settle(app, pilot)
        pane = app.query_one(AttentionPane)
        view = s.attention
        positions = s.prompt_len + len(s.records) - 1
        assert view is not None and view.layer == app.journey.model_layer and view.queries.stop == positions
        assert view.queries == window(positions - 1, positions, pane.rows_shown(), paged=False)  # the pane's rows
        exact = app.journey.worker.session.attention(view.queries, [view.layer])[0]
        # the future's weights are 0; rows kept from earlier snapshots were computed a few at a time,
        # so they match to float32 rounding rather than bit for bit
        np.testing.assert_allclose(np.nan_to_num(view.weights, nan=0.0), exact, rtol=0, atol=1e-6)
        assert "attends to" in shown(app, AttentionPane) and "computing" not in shown(app, AttentionPane)
        await pilot.press(*["left"] * 40, "left_square_bracket")  # the first token, another layer: new rows
        s = await settle(app, pilot)
        assert s.attention.queries.start == 0 and s.attention.layer == app.journey.model_layer
        await pilot.resize_terminal(120, 50)
        await pilot.pause(0.2)
        s = await settle(app, pilot)
        assert len(s.attention.queries) == min(app.query_one(AttentionPane).rows_shown(), positions)


@pytest.mark.parametrize("key", ["space", "n"])
async def test_step_keys_add_one_token(key):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        pending = before.pending.decision
        await pilot.press(key)
        after = await settle(app, pilot)
        assert len(after.chips) == len(before.chips) + 1
        assert after.chips[-1].id == pending.chosen_id
        assert "step 1" in str(app.query_one(StatusLine).render())


async def test_autoplay_runs_until_paused_and_pause_takes_effect():
    app = make_app(SamplingSettings(max_new_tokens=500), step_seconds=0.03)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(
            lambda: (
                app.journey.snapshot.playing and len(app.journey.snapshot.chips) > app.journey.snapshot.prompt_len + 3
            ),
            pilot,
            timeout=60,  # (a state, waited for generously: a loaded full run once took past 10 s)
        )
        assert "playing" in str(app.query_one(StatusLine).render())
        await pilot.press("a")
        paused = await settle(app, pilot)
        assert not app.journey.worker.playing
        await pilot.pause(0.2)
        assert len(app.journey.snapshot.chips) == len(paused.chips)  # no step after the pause


async def test_autoplay_stops_at_max_tokens():
    app = make_app(SamplingSettings(max_new_tokens=4))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot)
        s = await settle(app, pilot)
        assert len(s.chips) - s.prompt_len == 4 and s.state == "stopped"
        assert "stopped: max new tokens (4)" in str(app.query_one(StatusLine).render())


async def test_play_after_a_stop_says_how_this_stop_goes_on():
    """At an end of sequence the notice said "rewind or raise the limit to go on", where no limit applies."""
    from tokenviz.contract.commands import Play, Step
    from tokenviz.journey.stops import GOING_ON, how_to_go_on

    app = make_app(SamplingSettings(max_new_tokens=4))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot)
        await settle(app, pilot)
        app.journey.worker.submit(Play(on=True))
        await wait_for(lambda: "to go on" in (app.journey.snapshot.error or ""), pilot)
        assert "raise the limit (max_new_tokens)" in app.journey.snapshot.error
        await pilot.press("backspace")  # (back one step, then the model's end of sequence taken there)
        s = await settle(app, pilot)
        app.journey.worker.submit(Step(next(iter(app.journey.worker.session.engine.eos_ids))))
        await wait_for(lambda: app.journey.snapshot.stop_reason == "end of sequence", pilot)
        app.journey.worker.submit(Play(on=True))
        await wait_for(lambda: "end of sequence; to go on" in (app.journey.snapshot.error or ""), pilot)
        assert "limit" not in app.journey.snapshot.error and len(s.chips) > s.prompt_len
    assert [how_to_go_on(start + " (x)") for start, _ in GOING_ON] == [way for _, way in GOING_ON]


async def test_a_journey_key_pauses_autoplay_first():
    app = make_app(SamplingSettings(max_new_tokens=500), step_seconds=0.03)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(lambda: len(app.journey.snapshot.chips) > app.journey.snapshot.prompt_len + 2, pilot)
        await pilot.press("backspace")
        s = await settle(app, pilot)
        assert not s.playing and not app.journey.worker.playing


async def test_backspace_rewinds_and_r_resets():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        start = await settle(app, pilot)
        await pilot.press("space", "space", "space")
        three = await settle(app, pilot)
        await pilot.press("backspace")
        two = await settle(app, pilot)
        assert len(two.chips) == len(three.chips) - 1
        assert two.chips == three.chips[:-1]
        assert two.pending.decision.chosen_id == three.chips[-1].id  # same logits, same seed: same choice
        await pilot.press("r")
        reset = await settle(app, pilot)
        assert reset.chips == start.chips and reset.pending.decision == start.pending.decision
        await pilot.press("backspace")
        s = await settle(app, pilot)
        assert s.chips == start.chips  # nothing to rewind: a notification, no change
        assert any("nothing to rewind" in n.message for n in app._notifications)


async def test_e_edits_the_prompt_and_bad_prompts_keep_the_journey():
    app = make_app(context=32)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        before = await settle(app, pilot)
        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        field = app.screen.query_one(TextArea)
        assert field.text == PROMPT
        assert not app.screen.query(Checkbox)  # the tiny model has no chat template: plain text only
        field.text = "The cat sat on the mat. " * 8  # longer than the tiny model's context
        await pilot.press("ctrl+s")
        s = await settle(app, pilot)
        assert s.chips == before.chips  # nothing lost
        assert any("at most 32" in n.message for n in app._notifications)
        await enter_prompt(app, pilot, "Hello world")
        s = await settle(app, pilot)
        assert s.prompt == "Hello world" and len(s.chips) == s.prompt_len
        assert "".join(c.text for c in s.chips) == "Hello world"
        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        await pilot.press("escape")
        s = await settle(app, pilot)
        assert s.prompt == "Hello world"


@pytest.mark.parametrize(
    "key, field, expected",
    [
        ("t", "temperature", 0.6),
        ("T", "temperature", 0.8),
        ("k", "top_k", 40),
        ("K", "top_k", 100),
        ("p", "top_p", 0.85),
        ("P", "top_p", 0.95),
    ],
)
async def test_settings_keys_redecide_without_a_step(key, field, expected):
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        before = await settle(app, pilot)
        forwards = before.records[-1].forward_ms
        await pilot.press(key)
        s = await settle(app, pilot)
        assert getattr(s.settings, field) == expected
        assert len(s.records) == len(before.records) and s.records[-1].forward_ms == forwards  # no forward
        assert getattr(s.records[-1].decision.settings, field) == expected  # the pending decision was re-made
        label = {"temperature": f"T {expected:.2f}", "top_k": f"top-k {expected}", "top_p": f"top-p {expected:.2f}"}
        assert label[field] in shown(app, SamplingPane)


async def test_g_toggles_greedy_and_back():
    app = make_app(SamplingSettings(temperature=0.9))
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        s = await settle(app, pilot)
        assert s.settings.greedy and s.pending.decision.mode == "greedy"
        assert "greedy: argmax" in shown(app, SamplingPane)
        await pilot.press("g")
        s = await settle(app, pilot)
        assert s.settings.temperature == 0.9 and s.pending.decision.mode == "sampled"


async def test_s_draws_a_new_seed():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        before = await settle(app, pilot)
        await pilot.press("s")
        s = await settle(app, pilot)
        assert s.settings.seed != before.settings.seed
        assert s.pending.decision.u != before.pending.decision.u
        assert f"seed {s.settings.seed}" in shown(app, SamplingPane)


async def test_the_layer_and_head_keys_bring_the_attention_map_back_from_another_view():
    """With attribution (or any view) in the attention pane's place, ] and h changed the map unseen:
    now they bring it back, showing the layer and head they chose."""
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        views = app.query_one("#views")
        for key, shows in (("right_square_bracket", "layer 0 of 3"), ("h", "head max of 4")):
            await pilot.press("c")  # the KV cache view
            await wait_for(lambda: views.current == "cache", pilot)
            await pilot.press(key)
            await wait_for(lambda: views.current == "attention", pilot)
            assert shows in shown(app, AttentionPane)


async def test_brackets_change_layer_and_h_cycles_heads():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        assert "layer 2 of 3 · head mean of 4" in shown(app, AttentionPane)
        await pilot.press("left_square_bracket")
        await pilot.pause()
        assert app.journey.model_layer == 1 and "layer 1 of 3" in shown(app, AttentionPane)
        await pilot.press("right_square_bracket", "right_square_bracket")
        await pilot.pause()
        assert app.journey.model_layer == 0 and "layer 0 of 3" in shown(app, AttentionPane)
        await pilot.press("h")
        await pilot.pause()
        assert app.journey.head == "max" and "head max of 4" in shown(app, AttentionPane)
        await settle(app, pilot)
        assert "largest weight any head gives" in shown(app, AttentionPane)  # no distribution: not "attends to"
        await pilot.press("h", "h", "h")
        await pilot.pause()
        assert app.journey.head == 2 and "head 2 of 4 (kv group 1 of 2)" in shown(app, AttentionPane)
        await pilot.press("H")
        await pilot.pause()
        assert app.journey.head == 1 and "head 1 of 4 (kv group 0 of 2)" in shown(app, AttentionPane)


@pytest.mark.parametrize("rank", [1, 2, 5])
async def test_number_keys_force_the_ranked_token(rank):
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        before = await settle(app, pilot)
        wanted = before.pending.top[rank - 1].id
        await pilot.press(str(rank))
        s = await settle(app, pilot)
        assert s.chips[-1].id == wanted
        assert s.records[-2].decision.mode == "forced" and s.records[-2].decision.raw_rank == rank
        await pilot.press("left")
        await pilot.pause()
        assert "forced (a branch)" in shown(app, SamplingPane)


async def test_arrows_move_the_cursor_and_the_panes_follow():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        s = await settle(app, pilot)
        last = s.prompt_len - 1
        assert f"cursor at position {last}" in shown(app, TokensPane)
        await pilot.press("left", "left")
        await pilot.pause()
        assert app.journey.cursor == last - 2
        assert f"cursor at position {last - 2}" in shown(app, TokensPane)
        assert f"@{last - 2} attends to" in shown(app, AttentionPane)
        prediction = s.records[0].prompt_predictions[last - 2]  # inside the prompt: what the prefill predicted
        pane = shown(app, NextTokenPane)
        assert "the prompt's own" in pane and f"▶{prediction.next_rank} " in pane  # (the subtitle fits the pane)
        assert prediction.next_id == s.chips[last - 1].id and str(prediction.top[0].id) in pane
        await pilot.press("right", "right", "right")
        await pilot.pause()
        assert app.journey.cursor == last  # clamped to the newest token


async def test_question_mark_opens_help_and_ctrl_p_the_palette():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await wait_for(lambda: isinstance(app.screen, HelpScreen), pilot)
        help_text = app.screen.query_one("#help").source
        assert "Escape" in app.screen.query_one("#help").parent.border_subtitle  # it says how to close it
        for words in ("attention", "sampling", "next token", "KV cache", "backspace", "force"):
            assert words in help_text
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, HelpScreen), pilot)
        await pilot.press("ctrl+p")
        await wait_for(lambda: isinstance(app.screen, CommandPalette), pilot)
        await pilot.pause(0.3)
        shown = [str(o.prompt) for o in app.screen.query_one(OptionList).options]
        assert shown[0] == "Step: take the pending token"  # tokenviz's own commands first, in key order
        assert len(shown) == len(set(shown)) and sum(label.startswith("Theme") for label in shown) == 1
        await pilot.press(*"choose a colour theme")
        await pilot.pause(0.3)
        await pilot.press("enter")  # Textual's theme picker
        await wait_for(lambda: isinstance(app.screen, CommandPalette), pilot)
        await pilot.press(*"tokenviz-light")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(lambda: app.theme == "tokenviz-light", pilot)


async def test_ctrl_c_quits_too():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("ctrl+c")
        await wait_for(lambda: not app.is_running, pilot)


async def test_q_quits_and_stops_the_engine():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("q")
        await wait_for(lambda: not app.is_running, pilot)
    assert app.journey.worker._stopping.is_set()


async def test_quit_during_a_slow_step_is_prompt():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        runner = app.journey.worker.session.engine
        original = runner.forward
        runner.forward = lambda ids: time.sleep(3) or original(ids)
        await pilot.press("space")
        await pilot.pause(0.1)
        started = time.monotonic()
        await pilot.press("q")
        await wait_for(lambda: not app.is_running, pilot, timeout=5)
        assert time.monotonic() - started < 2.5  # it did not wait for the 3 s step (0.1 s when idle)


STORM = (
    ["space"] * 3
    + [
        "t",
        "backspace",
        "space",
        "K",
        "p",
        "space",
        "2",
        "backspace",
        "T",
        "space",
        "g",
        "space",
        "g",
        "s",
        "space",
        "k",
        "backspace",
        "backspace",
        "P",
        "3",
        "space",
    ]
) * 3  # (66 keys: the storm is a burst at hundreds a second; more repeats add time, not cases)


class Concurrency:
    """Counts the model's forward passes running at once."""

    def __init__(self, model):
        self.running = self.most = 0
        forward = model.forward

        def counted(*args, **kwargs):
            self.running += 1
            self.most = max(self.most, self.running)
            try:
                return forward(*args, **kwargs)
            finally:
                self.running -= 1

        model.forward = counted


async def test_key_storm_equals_the_same_keys_one_by_one():
    storm = make_app(SamplingSettings(seed=3, max_new_tokens=1000))
    async with storm.run_test(size=(120, 40)) as pilot:
        await settle(storm, pilot)
        concurrency = Concurrency(storm.journey.worker.session.engine.model)
        keys, submit = [], storm.journey.worker.submit
        storm.journey.worker.submit = lambda command: (keys.append(command), submit(command))
        started = time.monotonic()
        burst(storm, STORM)
        pressed_in = time.monotonic() - started

        def from_keys():
            return [c for c in keys if not isinstance(c, ShowAttention)]  # the pane's own requests aside

        await wait_for(lambda: len(from_keys()) >= len(STORM), pilot, timeout=60)  # the app read them all
        stormed = await settle(storm, pilot, timeout=120)
        assert len(from_keys()) == len(STORM) and stormed.handled == storm.journey.worker.submitted  # no key lost
        assert concurrency.most == 1  # never two forward passes at once

    calm = make_app(SamplingSettings(seed=3, max_new_tokens=1000))
    async with calm.run_test(size=(120, 40)) as pilot:
        await settle(calm, pilot)
        for key in STORM:
            await pilot.press(key)
            await settle(calm, pilot)
        one_by_one = calm.journey.snapshot

    assert len(STORM) / pressed_in > 100  # the storm really was hundreds of keys a second
    assert [c.id for c in stormed.chips] == [c.id for c in one_by_one.chips]
    assert stormed.settings == one_by_one.settings
    assert stormed.pending.decision == one_by_one.pending.decision
    assert len(stormed.chips) > stormed.prompt_len


async def test_a_model_that_fails_to_load_leaves_one_line_and_a_working_app():
    from tokenviz.contract.errors import ModelLoadError
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    def failing(progress):
        progress("loading", None)
        raise ModelLoadError("no such model path: ./nowhere")

    app = TokenvizApp(EngineWorker(failing, SamplingSettings(), PROMPT))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(lambda: app.journey.snapshot is not None and app.journey.snapshot.state == "error", pilot)
        await pilot.pause(0.1)
        assert app.fatal_error == "no such model path: ./nowhere"
        assert "no such model path" in str(app.query_one(StatusLine).render())
        await pilot.press("space", "question_mark")  # keys do not crash it
        await wait_for(lambda: isinstance(app.screen, HelpScreen), pilot)
        await pilot.press("escape", "q")
        await wait_for(lambda: not app.is_running, pilot)


def pane_text(app, widget_id: str) -> str:
    widget = app.query_one(f"#{widget_id}")
    body = widget.body if hasattr(widget, "body") else widget
    rendered = app.console.render_lines(body.content, app.console.options.update_width(widget.size.width or 100))
    return "\n".join("".join(seg.text for seg in line) for line in rendered)


async def test_views_lens_embedding_cache_timing_and_verify():
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space")
        s = await settle(app, pilot)
        await pilot.press("l")
        await wait_for(
            lambda: "top-1 from " in pane_text(app, "lens") or "never settles" in pane_text(app, "lens"), pilot
        )
        lens = pane_text(app, "lens")
        assert "emb" in lens and f"@{len(s.chips) - 1} " in lens
        assert app.journey.snapshot.result(Inspect).lens[-1].top[0][0] == s.pending.top[0].id  # last layer = the model
        await pilot.press("left")  # the lens follows the cursor
        await wait_for(lambda: f"@{len(s.chips) - 2} " in pane_text(app, "lens"), pilot)
        await pilot.press("m")
        await wait_for(lambda: "embedding row" in pane_text(app, "embedding"), pilot)
        embedding = pane_text(app, "embedding")
        assert "rotary" in embedding and "tied" in embedding and "residual stream norm" in embedding
        await pilot.press("c")
        await wait_for(lambda: "tokens held" in pane_text(app, "cache"), pilot)
        assert f"{len(s.chips)} tokens held" in pane_text(app, "cache") or "tokens held" in pane_text(app, "cache")
        await pilot.press("v")
        await wait_for(lambda: "verify @" in pane_text(app, "cache"), pilot)
        assert "rounding level" in pane_text(app, "cache") and "same argmax: yes" in pane_text(app, "cache")
        assert "compared with the whole context again" in pane_text(app, "cache")  # (what verify ran)
        await pilot.press("i")
        await wait_for(lambda: "prefill:" in pane_text(app, "timing"), pilot)
        assert "decode:" in pane_text(app, "timing")
        await pilot.press("i")
        await pilot.pause()
        assert app.query_one("#views").current == "attention"
        await pilot.press("backspace")
        await settle(app, pilot)
        await pilot.press("c")
        await wait_for(lambda: "kept the shared prefix" in pane_text(app, "cache"), pilot)


async def test_the_lens_view_shows_the_layers_lens_layers_names_and_says_a_layer_the_model_lacks():
    app = make_app(SamplingSettings(temperature=0), lens_layers="emb,1")
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("l")
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        assert [row.layer for row in app.journey.snapshot.result(Inspect).lens] == [0, 2]
        await wait_for(lambda: " L1 " in pane_text(app, "lens"), pilot)
        assert " L0 " not in pane_text(app, "lens")
    app = make_app(SamplingSettings(temperature=0), lens_layers="40")
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("l")
        await wait_for(lambda: "--lens-layers 40: the model's layers are 0 to" in pane_text(app, "lens"), pilot)


async def test_beam_view_runs_a_beam_search_from_the_current_tokens():
    from tokenviz.backends.transformers.beams import beam_search

    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        s = await settle(app, pilot)
        await pilot.press("B")
        await settle(app, pilot)
        await wait_for(lambda: app.journey.snapshot.result(Beams) is not None, pilot)
        await pilot.pause(0.1)
        text = pane_text(app, "beams")
        assert "width 3" in text and "final, best first" in text and "✓" in text
        result = app.journey.snapshot.result(Beams)
        expected = beam_search(app.journey.worker.session.engine, [c.id for c in s.chips], 3, 10)
        assert_close(result.final, expected.final)  # (the app's search and this one: see closeness.py)
        assert app.journey.snapshot.chips == s.chips  # the journey and its cache are untouched
        await pilot.press("space")
        after = await settle(app, pilot)
        assert after.chips[-1].id == s.pending.decision.chosen_id


async def test_speculation_view_drafts_and_verifies_from_the_current_tokens():
    from tokenviz.backends.transformers.speculation import make_drafter, speculative_decode

    app = make_app(SamplingSettings(temperature=0), prompt="The cat sat on the mat. The cat sat on the")
    async with app.run_test(size=(160, 48)) as pilot:
        s = await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        await wait_for(lambda: app.journey.snapshot.result(Speculate) is not None, pilot)
        await pilot.pause(0.1)
        text = pane_text(app, "speculation")
        drafter = f"early-exit:{s.info.layers // 2}"  # the default: it drafts on any text
        assert f"early-exit at layer {s.info.layers // 2}" in text and "round  1:" in text
        assert "output:" in text
        result = app.journey.snapshot.result(Speculate)
        runner = app.journey.worker.session.engine
        plain = speculative_decode(runner, [c.id for c in s.chips], make_drafter(drafter, runner), 16, s.settings)
        assert_close(result, plain)
        assert result.drafted > 0
        assert app.journey.snapshot.chips == s.chips  # the journey is untouched


async def test_a_round_with_no_draft_says_so_without_a_middle_dot():
    """UX 7's finding 22: a round prompt lookup could not draft for read `no draft · → ·also`, the `·` a
    space token's mark; it reads `(no draft) → ·also`."""
    from tokenviz.ui.keys import JOURNEY_OWNERS, routed

    app = make_app(SamplingSettings(temperature=0), prompt="The Eiffel Tower")  # (no repeat: nothing to look up)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await app.journey.run_action(routed("speculate('prompt-lookup')", JOURNEY_OWNERS))
        await wait_for(lambda: "(no draft) → " in pane_text(app, "speculation"), pilot)
        text = pane_text(app, "speculation")
        assert "no draft ·" not in text, text


async def test_branching_at_the_cursor_and_switching_branches():
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "space", "space")
        first = await settle(app, pilot)
        n = first.prompt_len
        await pilot.press("left", "left")  # from the 4th generated token (position n+3) onto the 2nd
        assert app.journey.cursor == n + 1
        candidate = first.records[2].top[1].id  # the panes show what was predicted after the cursor's token
        assert str(candidate) in shown(app, NextTokenPane)
        await pilot.press("2")  # take the 2nd candidate on screen instead of the 3rd token
        branched = await settle(app, pilot)
        assert [c.id for c in branched.chips[: n + 2]] == [c.id for c in first.chips[: n + 2]]
        assert branched.chips[n + 2].id == candidate and len(branched.chips) == n + 3
        assert len(branched.branches) == 2 and branched.branches[1].tokens == 4
        await pilot.press("o")  # outside the branch tree: o shows the branches, and switches nothing unseen
        await wait_for(lambda: app.query_one("#views").current == "branches", pilot)
        assert (await settle(app, pilot)).chips == branched.chips
        await pilot.press("b")  # back to attention, as a view key does
        await pilot.pause(0.1)
        # the same move made at the newest token gives the same journey
        same = Session(ModelRunner(tiny_model("llama")), SamplingSettings(temperature=0))
        same.start(PROMPT)
        same.step()
        same.step()
        same.take_rank(2)
        assert [c.id for c in branched.chips] == same.ids
        await pilot.press("b")
        await pilot.pause(0.1)
        text = pane_text(app, "branches")
        assert "current" in text and "branch 1" in text and "log-prob" in text
        await pilot.press("o")
        switched = await settle(app, pilot)
        assert [c.id for c in switched.chips] == [c.id for c in first.chips]
        assert switched.pending.decision.chosen_id == first.pending.decision.chosen_id
        assert switched.cache_event.kept == n + 2


PALETTE_VIEWS = {
    "View: logit lens": "lens",
    "View: KV cache": "cache",
    "View: timing": "timing",
    "View: branch tree": "branches",
    "Beam search, width 5": "beams",
    "Speculative decoding: prompt lookup": "speculation",
}


def top_hit(app) -> str | None:
    """The text of the command the palette has highlighted (what enter runs), if any."""
    if not isinstance(app.screen, CommandPalette):
        return None
    commands = app.screen.query_one(CommandList)
    if commands.highlighted is None:
        return None
    return str(commands.get_option_at_index(commands.highlighted).hit.text)


async def test_the_palette_reaches_every_view():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        for entry, view in PALETTE_VIEWS.items():
            await pilot.press("ctrl+p")
            await wait_for(lambda: isinstance(app.screen, CommandPalette), pilot)
            app.screen.query_one(Input).value = entry  # (as typed: the palette searches it)
            await wait_for(lambda: top_hit(app) == entry, pilot)  # noqa: B023 (awaited here)
            await pilot.press("enter")
            await wait_for(lambda: app.query_one("#views").current == view, pilot)  # noqa: B023 (awaited here)
            if view == "beams":
                await wait_for(
                    lambda: (
                        app.journey.snapshot.result(Beams) is not None and app.journey.snapshot.result(Beams).width == 5
                    ),
                    pilot,
                )


async def test_the_first_frame_shows_loading_progress_before_the_model_is_ready():
    import threading

    from textual.widgets import ProgressBar
    from tiny import tiny_model

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    release = threading.Event()

    def slow_loader(progress):
        progress("converting model.gguf to safetensors once", 0.5)
        release.wait(10)
        return ModelRunner(tiny_model("llama"))

    app = TokenvizApp(EngineWorker(slow_loader, SamplingSettings(), PROMPT))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(lambda: app.journey.snapshot is not None and app.journey.snapshot.progress == 0.5, pilot)
        await pilot.pause(0.1)
        bar = app.query_one("#loading", ProgressBar)
        assert bar.display and not bar.has_class("-hidden") and bar.progress == 0.5
        status = str(app.query_one(StatusLine).render())
        assert "loading 50%" in status and "converting model.gguf" in status
        release.set()
        s = await settle(app, pilot)
        assert s.state == "ready" and app.query_one("#loading", ProgressBar).has_class("-hidden")


async def test_the_loading_bar_stops_animating_once_hidden():
    from textual.widgets import ProgressBar
    from textual.widgets._progress_bar import Bar

    app = make_app()  # a loader that gives no fraction: the bar pulses while it loads
    async with app.run_test(size=(120, 40)) as pilot:
        bar = app.query_one("#loading", ProgressBar).query_one(Bar)
        await settle(app, pilot)
        await pilot.pause(0.1)
        # Hidden, it must not animate: an indeterminate bar redraws the screen 15 times a second.
        assert app.query_one("#loading").has_class("-hidden") and bar.auto_refresh is None


async def test_number_keys_inside_the_prompt_change_nothing_and_say_why():
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        before = await settle(app, pilot)
        await pilot.press("left", "left", "3")
        await pilot.pause(0.1)
        s = await settle(app, pilot)
        assert s.chips == before.chips
        assert any("inside the prompt" in n.message for n in app._notifications)


async def test_the_tokens_pane_follows_the_newest_token_and_the_cursor_at_80x24():
    long_prompt = "The cat sat on the mat. The dog sat on the log. " * 4
    app = make_app(SamplingSettings(seed=3, max_new_tokens=1000), prompt=long_prompt, context=512)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press(*["space"] * 6)
        s = await settle(app, pilot)
        tokens = shown(app, TokensPane)
        assert len(s.chips) > 50 and "lines" in tokens  # more lines than the pane shows
        newest = s.chips[-1]
        body = tokens.splitlines()[1:-2]  # the rows on screen, the text and the subtitle aside
        assert len(body) == 2 and str(newest.id) in body[-1]  # the newest chip is on the last chip row
        assert "text: " in tokens and "→ next:" not in tokens  # (the next-token pane says it at this size)
        await pilot.press(*["left"] * len(s.chips))  # the cursor to the first token
        await pilot.pause(0.1)
        tokens = shown(app, TokensPane)
        assert "cursor at position 0" in tokens and tokens.splitlines()[1].startswith("The")


async def test_at_80x24_a_short_prompt_stays_on_screen_once_generation_starts():
    """UX 7's finding 15: at 80x24 the tokens pane kept one chip line once generation started, so a prompt of
    one line scrolled away at the first step that needed a second. Two chip lines: the prompt's first token
    is still on screen when the answer's first tokens fill the second."""
    app = make_app(SamplingSettings(seed=3, max_new_tokens=1000), prompt="The cat sat on the mat.")
    async with app.run_test(size=(80, 24)) as pilot:
        s = await settle(app, pilot)
        while len(app.query_one(TokensPane)._chip_lines.starts) < 2:  # until the chips need a second line
            await pilot.press("space")
            await wait_for(lambda n=len(s.chips): len(app.journey.snapshot.chips) > n, pilot)
            s = await settle(app, pilot)
        tokens = shown(app, TokensPane).splitlines()
        assert tokens[1].startswith("The") and str(s.chips[-1].id) in tokens[2], tokens
        assert tokens[3].startswith("text: "), tokens


async def test_the_pending_greedy_step_gives_its_raw_p_not_a_final_one():
    """Issue 69, finding 20: greedy's final distribution is one-hot; the trailer said "greedy, final p
    0.371" (the raw p)."""
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(120, 36)) as pilot:
        s = await settle(app, pilot)
        tokens = shown(app, TokensPane)
        raw = s.pending.decision.raw_prob
        assert f"greedy: argmax, raw p {probability(raw)}" in tokens and "final p" not in tokens, tokens


async def test_any_sequence_of_resizes_keeps_every_pane_and_the_status_line():
    app = make_app(SamplingSettings(seed=3))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        for width, height in ((80, 24), (200, 60), (80, 24), (120, 36), (240, 70), (80, 24)):
            await pilot.resize_terminal(width, height)
            await pilot.pause(0.2)
            assert app.screen.has_class("-narrow") == (width < 120) and app.screen.has_class("-short") == (height < 30)
            for pane in (TokensPane, AttentionPane, NextTokenPane, SamplingPane):
                region = app.query_one(pane).region
                assert region.height >= 3 and region.width >= 20 and region.bottom <= height, (pane, region)
            status = app.query_one(StatusLine).region
            assert status.height == 1 and status.bottom <= height - 1  # above the footer


async def test_a_slow_command_shows_what_runs_at_once_and_tok_s_counts_steps_only():
    # A step long enough that a loaded machine's UI thread still draws the "stepping" frame before the next one
    # (0.8 s was missed once in a full run beside other work).
    step_s = 2.0
    app = make_app(SamplingSettings(seed=3, max_new_tokens=1000), step_seconds=step_s)
    async with app.run_test(size=(120, 40)) as pilot:
        s = await settle(app, pilot)
        assert s.tokens_per_s is None  # the prefill is not a decode step
        await pilot.press("space")
        await wait_for(lambda: app.journey.snapshot.state == "stepping", pilot)
        await pilot.pause(0.05)
        assert "stepping" in str(app.query_one(StatusLine).render())
        s = await settle(app, pilot)
        assert s.state == "ready" and 0 < s.tokens_per_s < 1 / step_s
        await pilot.press("v")
        await wait_for(lambda: app.journey.snapshot.state == "verifying", pilot)
        await settle(app, pilot)
        await enter_prompt(app, pilot, "Hello world")
        s = await settle(app, pilot)
        assert s.prompt == "Hello world" and s.tokens_per_s is None  # a new journey: no old figure


async def test_a_quit_signal_ends_the_process_even_if_the_shutdown_hangs(monkeypatch):
    """SIGHUP or SIGTERM quits as q does, and arms a last resort: Textual's shutdown has been seen to
    wait forever on a terminal that is gone, and then the process ends after QUIT_GRACE_S anyway."""
    import threading as threading_module

    from tokenviz.ui import app as app_module

    ended, codes = threading_module.Event(), []
    monkeypatch.setattr(app_module, "QUIT_GRACE_S", 0.2)
    monkeypatch.setattr(app_module.os, "_exit", lambda code: (codes.append(code), ended.set()))
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        app._signalled(signal.SIGTERM)
        await pilot.pause(0.1)
    assert app.return_code is not None or not app.is_running  # it quit as q does
    assert ended.wait(2) and codes == [128 + signal.SIGTERM] and app.signalled == signal.SIGTERM


async def test_a_load_of_unknown_length_shows_its_elapsed_time_and_escape_says_what_it_can_do():
    """As --compile's warm-up: no fraction to show, so the seconds go by on the status line; a key
    pressed meanwhile is said to be queued, and runs once the model is ready; Escape says at once that
    the load cannot stop part way."""
    import threading

    from tiny import tiny_model

    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    release = threading.Event()

    def compiling_loader(progress):
        progress("compiling the decode step on cpu (torch.compile, once per start)", None)
        release.wait(20)
        return ModelRunner(tiny_model("llama"))

    app = TokenvizApp(EngineWorker(compiling_loader, SamplingSettings(temperature=0), PROMPT))
    async with app.run_test(size=(120, 40)) as pilot:

        def status() -> str:
            return str(app.query_one(StatusLine).render())

        await wait_for(lambda: "compiling the decode step" in status(), pilot)
        # (the line ticks by itself; the time so far comes first, before the message)
        await wait_for(lambda: status().startswith("loading · 2 s · compiling"), pilot, timeout=30)
        await pilot.press("space")
        await wait_for(lambda: any("queued" in n.message for n in app._notifications), pilot)
        await pilot.press("escape")
        await pilot.pause(0.5)
        assert any("loading cannot stop part way" in n.message for n in app._notifications)
        release.set()
        await settle(app, pilot)
        await wait_for(lambda: len(app.journey.snapshot.records) == 2, pilot)  # the space, once ready


async def test_the_prompt_editor_counts_a_pasted_texts_tokens_at_once():
    """An 11 KB paste lands whole (one event), and the editor counts its tokens with the model's own
    tokenizer, off the UI thread, and says when the model cannot read that many."""
    from textual import events
    from textual.widgets import Label, TextArea

    from tokenviz.ui.screens import PromptScreen

    app = make_app(context=128)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        count = app.screen.query_one("#prompt-count", Label)
        ids = len(app.journey.worker.session.engine.encode(PROMPT))
        await wait_for(lambda: str(count.render()).startswith(f"{ids} tokens"), pilot)
        area = app.screen.query_one(TextArea)
        area.select_all()
        text = "The Eiffel Tower is located in Paris. " * 290  # 11 KB
        app.post_message(events.Paste(text))
        await wait_for(lambda: area.text == text, pilot)
        expected = len(app.journey.worker.session.engine.encode(text))
        await wait_for(lambda: str(count.render()).startswith(f"{expected:,} tokens"), pilot)
        assert "more than the 128 this model reads" in str(count.render())
