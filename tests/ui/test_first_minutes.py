"""The first five minutes: scrolling by keys, the footer and status line at any width, the ids key,
the decoded text, autoplay's pace, the model view, a recording's keys and chips that stay apart in
every colour system."""

import itertools
import math
import time

import pytest
from apptools import enter_prompt, frozen_recording, make_app, model_text, recorded_app, settle, text_of, wait_for
from rich.color import ColorSystem
from rich.text import Text
from textual.widgets import Footer

from tokenviz.contract.commands import Beams, Inspect, Speculate, Verify
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.panes.tokens import SURPRISAL_TOP_BITS, TokensPane, piece_of


def footer_keys(app) -> list[str]:
    return [str(key.description) for key in app.query_one(Footer).query("FooterKey")]


async def test_arrow_and_page_keys_scroll_the_open_view_and_move_the_cursor_by_lines():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=200))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        for _ in range(40):
            await pilot.press("space")
        await settle(app, pilot)
        tokens = app.query_one(TokensPane)
        newest = app.journey.current_selection().cursor
        await pilot.press("up")
        await pilot.pause()
        above = app.journey.cursor
        assert above < newest and tokens._chip_lines.line_of(above) == tokens._chip_lines.line_of(newest) - 1
        await pilot.press("home")
        await pilot.pause()
        assert app.journey.cursor == 0
        assert "cursor at position 0" in str(tokens.border_subtitle)  # the pane followed it to the start
        await pilot.press("pagedown")
        await pilot.pause()
        assert tokens._chip_lines.line_of(app.journey.cursor) == tokens.page_lines()
        await pilot.press("end")
        await pilot.pause()
        assert app.journey.cursor is None  # following the newest token again

        await pilot.press("m")  # the embedding view is longer than its pane at 80x24
        await settle(app, pilot)
        view = app.query_one("#embedding")
        await wait_for(lambda: view.max_scroll_y > 0, pilot)
        await pilot.press("down")
        await pilot.pause()
        assert view.scroll_y == 1
        await pilot.press("end")
        await pilot.pause()
        assert view.scroll_y == view.max_scroll_y
        await pilot.press("home")
        await pilot.pause()
        assert view.scroll_y == 0


@pytest.mark.parametrize("width", [80, 120, 200])
async def test_quit_and_help_stay_in_the_footer_and_device_and_dtype_in_the_status_line(width):
    app = make_app()
    async with app.run_test(size=(width, 30)) as pilot:
        await settle(app, pilot)
        await pilot.pause(0.2)
        assert footer_keys(app)[:2] == ["quit", "help"]
        status = text_of(app.query_one(StatusLine))
        assert "ready · step 0" in status and "cpu · float32" in status
        assert len(status.rstrip()) <= width


async def test_the_ids_key_hides_the_ids_and_a_line_shows_the_decoded_text():
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(160, 40)) as pilot:
        s = await settle(app, pilot)
        tokens = app.query_one(TokensPane)
        ids = [str(c.id) for c in s.chips]
        shown = str(tokens.render())
        assert all(i in shown for i in ids)
        assert "text: " + s.full_text.replace("\n", "↵") in shown
        await pilot.press("number_sign")
        await pilot.pause()
        hidden = str(tokens.render())
        assert not any(f" {i} " in hidden for i in ids) and "text: " in hidden


async def test_autoplay_keeps_the_pace_chosen():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=500))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("minus", "minus", "minus")  # 0.1, 0.25, 0.5 s between steps
        await wait_for(lambda: app.journey.snapshot.pace_s == 0.5, pilot)
        before = len(app.journey.snapshot.records)
        started = time.monotonic()  # (before the key: on a busy machine its press returns after steps are taken)
        await pilot.press("a")
        await pilot.pause(1.6)
        steps = len(app.journey.snapshot.records) - before
        assert "a step every 0.5 s" in text_of(app.query_one(StatusLine))
        await pilot.press("a")
        assert 1 <= steps <= int((time.monotonic() - started) / 0.5) + 1
        await settle(app, pilot)
        await pilot.press("plus", "plus", "plus", "plus")
        await wait_for(lambda: app.journey.snapshot.pace_s == 0.0, pilot)


async def test_model_info_is_a_view():
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("M")
        await wait_for(lambda: app.query_one("#views").current == "model", pilot)
        shown = model_text(app.query_one("#model"))
        assert "architecture" in shown and "LlamaForCausalLM" in shown and "key/value heads" in shown
        import torch
        import transformers

        runtime = f"transformers {transformers.__version__} (PyTorch {torch.__version__.split('+')[0]})"
        assert "runtime" in shown and runtime in shown  # (said as data: ModelInfo.runtime)
        await pilot.pause(2)
        assert app.query_one("#views").current == "model"  # it stays: no toast


async def test_a_recording_shows_only_the_keys_that_work_there():
    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(app, pilot)
        await pilot.pause(0.2)
        shown = footer_keys(app)
        assert shown[:2] == ["quit", "help"] and "step" in shown and "rewind" in shown
        for model_key in ("play/pause", "prompt", "temp±", "greedy", "seed"):
            assert model_key not in shown
        records = len(app.journey.snapshot.records)
        await pilot.press("a", "g", "1")
        await pilot.pause(0.2)
        assert not app.journey.snapshot.playing and len(app.journey.snapshot.records) == records
        notes = [n.message for n in app._notifications]  # each key says what it needs, and how to get it
        assert [note.split(" ")[0] for note in notes] == ["a", "g", "1"]
        assert all("needs the model" in note and "tokenviz --model" in note for note in notes)


@pytest.mark.parametrize("system", [ColorSystem.EIGHT_BIT, ColorSystem.STANDARD])
@pytest.mark.parametrize("theme", ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"])
async def test_prompt_and_generated_chips_stay_apart_in_256_and_16_colours(theme, system):
    app = recorded_app(frozen_recording(steps=3), theme=theme)
    async with app.run_test(size=(160, 40)) as pilot:
        s = await settle(app, pilot)
        tokens = app.query_one(TokensPane)

        def colours(index: int) -> tuple:
            """The piece's (colour, background) as a terminal of `system` shows them."""
            text = Text()
            tokens._append_chip(text, index, cursor=-1)
            style = next(span.style for span in text.spans if span.end - span.start == len(piece_of(s.chips[index])))
            return tuple(c.downgrade(system).number if c else None for c in (style.color, style.bgcolor))

        assert colours(1) != colours(s.prompt_len + 1)  # (the newest chip is bold besides)
        assert "▸ " in tokens.render().plain  # a mark where generation begins, for no colour at all


async def test_byte_chips_show_the_character_they_spell():
    import dataclasses

    from tokenviz.files.journey_file import Recording

    recording = frozen_recording(steps=3)
    chips = list(recording.snapshot.chips)
    for i, byte in zip((1, 2, 3), ("<0xE2>", "<0x82>", "<0xAC>")):
        chips[i] = dataclasses.replace(chips[i], text=byte)
    snapshot = dataclasses.replace(recording.snapshot, chips=tuple(chips))
    app = recorded_app(Recording(snapshot, recording.attention))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        shown = app.query_one(TokensPane).render().plain
        assert f"<0xE2> {chips[1].id}  <0x82> {chips[2].id}  <0xAC>→€ {chips[3].id}" in shown


@pytest.mark.parametrize("theme", ["tokenviz-dark", "tokenviz-light", "tokenviz-contrast"])
async def test_the_settings_line_and_pane_figures_are_in_the_full_contrast_text_colour(theme):
    from textual.color import Color

    from tokenviz.ui.panes.sampling import SamplingPane

    app = recorded_app(frozen_recording(steps=3), theme=theme)
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        foreground = Color.parse(app.current_theme.foreground)
        for pane in (app.query_one(SamplingPane), app.query_one(TokensPane), app.query_one("#attention")):
            assert pane.styles.border_subtitle_color.rgb == foreground.rgb, pane
        assert "seed" in str(app.query_one(SamplingPane).border_subtitle)  # the settings line is that subtitle


async def test_a_chosen_token_outside_the_top_n_keeps_its_row_on_screen():
    from tokenviz.contract.records import Candidate
    from tokenviz.ui.panes.next_token import NextTokenPane

    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(120, 30)) as pilot:
        s = await settle(app, pilot)
        pane = app.query_one(NextTokenPane)
        lines = pane._table(s.latest.top, Candidate(299, "far", 0.0, 1e-6), 250).plain.splitlines()
        assert len(lines) <= pane.content_size.height and lines[-1].lstrip().startswith("▶250")


async def test_u_shades_every_token_by_the_surprisal_the_model_computed():
    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(160, 40)) as pilot:
        s = await settle(app, pilot)
        tokens = app.query_one(TokensPane)
        assert tokens._surprisal_shade(1) is None
        await pilot.press("u")
        await pilot.pause()
        predictions = s.records[0].prompt_predictions
        shades = {i: tokens._surprisal_shade(i).bgcolor for i in range(1, s.prompt_len)}
        order = sorted(range(1, s.prompt_len), key=lambda i: predictions[i - 1].surprisal)
        least, most = order[0], order[-1]
        assert predictions[most - 1].surprisal > predictions[least - 1].surprisal
        assert shades[least] != shades[most]  # the scale follows the model's own numbers
        assert tokens._surprisal_shade(0) is None  # the first token is read, not predicted
        for i in range(s.prompt_len, len(s.chips)):  # a generated token: by its decision's raw probability
            bits = -math.log2(s.records[i - s.prompt_len].decision.raw_prob)
            assert tokens._surprisal_shade(i) == tokens._shade(bits / SURPRISAL_TOP_BITS)
        assert "surprisal" in str(tokens.border_subtitle)


async def test_a_new_prompt_clears_every_view_of_the_old_run():

    app = make_app(SamplingSettings(temperature=0), prompt="The cat sat on the mat. The cat sat on the")
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("B")
        await wait_for(lambda: app.journey.snapshot.result(Beams) is not None, pilot)
        await pilot.press("S")
        await wait_for(lambda: app.journey.snapshot.result(Speculate) is not None, pilot)
        await pilot.press("v")
        await wait_for(lambda: app.journey.snapshot.result(Verify) is not None, pilot)
        await settle(app, pilot)
        await enter_prompt(app, pilot, "Hello world")
        s = await settle(app, pilot)
        assert s.prompt == "Hello world"
        assert (s.result(Beams), s.result(Speculate), s.result(Verify), s.result(Inspect), s.tokens_per_s) == (
            None,
        ) * 5


async def test_autoplay_spaces_its_frames_and_draws_the_last_at_once():
    from tokenviz.ui import worker_screen

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=60), step_seconds=0.05)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        # As if every frame took 50 ms: frames at most every 50 ms / UI_SHARE, no more than a second
        # apart; autoplay's first step and the last at once.
        app.journey._frame_cost = 0.05
        app.journey._measure_frame = lambda seconds: None
        spacing = min(0.05 / worker_screen.UI_SHARE, worker_screen.MAX_FRAME_GAP_S)
        drawn = []
        original = app.journey._apply_snapshot
        app.journey._apply_snapshot = lambda: (drawn.append(time.perf_counter()), original())[-1]
        started = time.perf_counter()
        await pilot.press("a")
        await wait_for(
            lambda: app.journey.snapshot.stop_reason is not None and not app.journey.snapshot.playing, pilot, 60
        )
        stopped = time.perf_counter()
        await wait_for(lambda: not app.journey._repaint_scheduled, pilot)
        # A rate, whatever else the machine runs: no two frames of the autoplay closer than the spacing
        # (the last is drawn at once), and no more of them than its duration allows.
        gaps = [b - a for a, b in itertools.pairwise(drawn[1:-1])]  # (after the key's frame and the first step's)
        assert all(gap >= spacing * 0.8 for gap in gaps)
        assert len(drawn) <= (stopped - started) / spacing + 3  # (every snapshot drawn would be ~60)
        assert drawn[-1] - stopped < 0.5  # the last frame did not wait for its tick
        assert app.query_one(TokensPane).selection.snapshot is app.journey.snapshot  # the final frame is on screen


@pytest.mark.parametrize("key, view", [("l", "lens"), ("m", "embedding"), ("B", "beams"), ("S", "speculation")])
async def test_a_recordings_notes_fit_at_80x24(key, view):
    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        app.query_one("#views").current = view  # (B and S are off in a recording; the views are not)
        app.journey.refresh_panes()
        await pilot.pause(0.2)
        pane = app.query_one(f"#{view}")
        lines = [line.text.strip() for line in pane.body.render_lines(pane.body.region.reset_offset)]
        shown = " ".join(line for line in lines if line)
        name = app.journey.snapshot.info.name
        assert f"it needs the model. Run the journey's prompt live with tokenviz --model {name}" in shown, shown
        assert "(replay --verify only checks the recorded numbers)" in shown, shown


async def test_no_pane_moves_while_the_model_loads_and_prefills_at_120x36():
    """Issue 69, finding 27: at 120x36 the first frame showed 8 candidates and an empty row, then 9: the
    loading bar took a line of its own while the model loaded and prefilled, so the panes below it moved
    (the next-token pane 9 → 10 → 9 → 10 rows). The bar lies over the tokens pane's border: from the first
    frame on, the next-token pane keeps its size, and the bar is shown while the model loads."""
    from tokenviz.ui.panes.next_token import NextTokenPane

    sizes, bar_shown = [], []
    resized = NextTokenPane.on_resize

    def recorded(pane) -> None:
        sizes.append(pane.size.height)
        resized(pane)

    NextTokenPane.on_resize = recorded
    try:
        app = make_app(SamplingSettings(temperature=0), step_seconds=0.3)  # (a prefill that takes a while)
        async with app.run_test(size=(120, 36)) as pilot:
            while app.journey.snapshot is None or not app.journey.snapshot.records:
                bar_shown.append(app.screen.query_one("#loading").display)
                await pilot.pause(0.01)
            await settle(app, pilot)
            pane = app.screen.query_one(NextTokenPane)
            assert set(sizes) == {pane.size.height}, sizes
            assert True in bar_shown  # (the bar still says the model is loading)
    finally:
        NextTokenPane.on_resize = resized


async def test_a_wrapped_row_of_the_model_view_stays_under_its_value():
    """UX 7's finding 22: at 80x24 a long row of `M` (the engine's capabilities, the attention) wrapped to the
    names' column, so it read as rows of their own. At every size only the rows' names begin a line; a value
    is on the lines after its name (beside it where there is room, else under it, indented), word by word,
    no line wider than the view."""
    from tokenviz.ui.panes.model import ModelPane, rows_of

    for size in ((80, 24), (120, 36), (200, 60)):
        app = make_app()
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await pilot.press("M")
            await wait_for(lambda app=app: app.query_one("#views").current == "model", pilot)
            lines = str(app.query_one("#model").body.render()).splitlines()
            rows = rows_of(app.journey.snapshot.info)
            starts = [i for i, line in enumerate(lines) if line and not line[0].isspace()]
            assert [lines[i].split("  ")[0] for i in starts] == [name for name, _ in rows], lines
            for (name, value), begin, end in zip(rows, starts, [*starts[1:], len(lines)], strict=True):
                said = " ".join(lines[begin:end]).removeprefix(name).split()
                assert said == value.split(), (size, name, said)
            width = app.query_one(ModelPane).body.content_size.width
            assert all(len(line) <= width for line in lines), (size, width, lines)
