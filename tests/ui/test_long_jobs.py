"""Long jobs in the app: their progress and time left in the status line and their view, a cancelled
view that says so and how to run it again, an Escape pressed before the job starts, a long
leave-one-out said before it starts, view keys that toggle, keys drawn at once during autoplay, and a
recording's model keys that say what they need."""

import re
import time

from apptools import frozen_recording, make_app, recorded_app, settle, wait_for
from textual.widgets import OptionList
from tiny import tiny_model

from tokenviz.contract.commands import Attribute, Beams, Speculate
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.screens import LongJobScreen

LONG = "The cat sat on the mat and looked at the dog on the log. " * 3


def status(app) -> str:
    return str(app.query_one(StatusLine).render())


def body(app, view: str) -> str:
    widget = app.query_one(f"#{view}")
    lines = widget.body.render_lines(widget.body.region.reset_offset)
    return " ".join(line.text.strip() for line in lines if line.text.strip())


async def test_a_beam_search_shows_its_progress_then_escape_says_cancelled_and_b_runs_it_again():
    # Steps slow enough that the search is still running when Escape is pressed, on a busy machine too
    # (at 0.15 s a step, 1.5 s in all, a loaded run once saw it end before the press).
    app = make_app(step_seconds=0.4)
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        await pilot.press("B")
        await wait_for(lambda: "beam search: step" in (app.journey.snapshot.message or ""), pilot)
        await wait_for(lambda: "left (Escape cancels)" in status(app), pilot)
        assert "of 10" in status(app) and "beam search: step" in body(app, "beams")
        pressed = time.perf_counter()
        await pilot.press("escape")
        assert "cancelling" in status(app) and time.perf_counter() - pressed < 0.5  # acknowledged at once
        s = await settle(app, pilot)
        assert "Beams" in s.cancelled and s.result(Beams) is None and s.chips == before.chips
        await wait_for(lambda: "cancelled (Escape). Press B to run it again" in body(app, "beams"), pilot)
        assert not any(n.severity == "error" for n in app._notifications)  # news, not an error
        assert "(Escape cancels)" not in status(app)  # the status line says ready again
        await pilot.press("B")  # the key runs it again (the view stays)
        await wait_for(lambda: app.journey.snapshot.result(Beams) is not None, pilot, 30)
        assert "Beams" not in app.journey.snapshot.cancelled
        await settle(app, pilot)
        await pilot.press("B")  # with the beams shown, the key returns to attention
        await pilot.pause(0.1)
        assert app.query_one("#views").current == "attention"
        assert app.journey.worker.submitted == app.journey.snapshot.handled  # and starts nothing


async def test_a_move_made_during_a_long_job_is_said_to_be_queued():
    app = make_app(step_seconds=0.15)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("B")
        await wait_for(lambda: "left (Escape cancels)" in status(app), pilot)
        await pilot.press("space")
        assert any("queued: it runs when the job now running ends" in str(n.message) for n in app._notifications)


async def test_an_escape_pressed_before_the_job_starts_still_cancels_it():
    app = make_app(step_seconds=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        app.journey.submit(Beams(width=3, steps=10))  # queued behind...
        app.journey.worker.submit(Speculate(drafter="prompt-lookup", steps=16))
        app.journey.action_cancel()  # ...and Escape before either starts
        s = await settle(app, pilot)
        assert {"Beams", "Speculate"} <= set(s.cancelled)
        assert s.result(Beams) is None and s.result(Speculate) is None and s.chips == before.chips


async def test_speculation_toggles_and_its_view_says_it_was_cancelled():
    app = make_app(step_seconds=0.15)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await wait_for(lambda: "speculating:" in status(app), pilot)
        await pilot.press("escape")
        await settle(app, pilot)
        await wait_for(lambda: "Press S to run it again" in body(app, "speculation"), pilot)
        await pilot.press("S")
        await wait_for(lambda: app.journey.snapshot.result(Speculate) is not None, pilot, 30)
        await settle(app, pilot)
        await pilot.press("S")
        await pilot.pause(0.1)
        assert app.query_one("#views").current == "attention"


async def test_a_long_leave_one_out_is_said_before_it_starts_and_offers_gradient_times_input():
    app = make_app(SamplingSettings(temperature=0), prompt=LONG, step_seconds=0.3, context=256)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        sent, submit = [], app.journey.worker.submit
        app.journey.worker.submit = lambda command: (sent.append(command), submit(command))
        await pilot.press("A")
        await wait_for(lambda: isinstance(app.screen, LongJobScreen), pilot)
        assert not any(isinstance(c, Attribute) for c in sent)  # nothing started yet
        question = str(app.screen.query_one("Label").render())
        assert "Leave-one-out runs the model once for each of the" in question and "about" in question
        options = app.screen.query_one(OptionList)
        # leave-one-out first, the default as the docs say (UX 7's finding 11: the chooser put gradient × input
        # first); the second is gradient × input
        assert [options.get_option_at_index(k).id for k in range(options.option_count)] == ["loo", "grad"]
        await pilot.press("down", "enter")
        await wait_for(lambda: (app.journey.snapshot.result(Attribute) or None) is not None, pilot, 30)
        assert app.journey.snapshot.result(Attribute).method == "grad"


async def test_a_setting_changed_during_autoplay_is_drawn_at_once():
    app = make_app(SamplingSettings(max_new_tokens=400), step_seconds=0.03, context=1024)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        before = app.journey.snapshot.settings.temperature
        app.journey._frame_cost = 0.2  # frames spaced 4 s apart, as on a slow terminal
        app.journey._measure_frame = lambda seconds: None
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot_drawn.playing, pilot)
        await pilot.pause(0.5)
        pressed = time.monotonic()
        await pilot.press("T")
        await wait_for(lambda: app.journey.snapshot_drawn.settings.temperature > before + 0.05, pilot, 3.5)
        assert time.monotonic() - pressed < 2.0  # not at the next spaced frame, up to 4 s later
        assert app.journey.snapshot_drawn.playing  # (still playing: a frame that ends autoplay is drawn at once)
        await pilot.press("a")


async def test_a_recordings_model_keys_say_what_they_need():
    app = recorded_app(frozen_recording(steps=3))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("B")
        name = app.journey.snapshot.info.name
        await wait_for(lambda: any("B needs the model" in n.message for n in app._notifications), pilot)
        note = next(n.message for n in app._notifications if "B needs the model" in n.message)
        assert f"tokenviz --model {name}" in note


async def test_a_recording_says_so_on_the_status_line_and_its_times_are_the_recorded_ones():
    """Issue 51, item 11: replay said nothing on screen that it is a recording, and its status showed
    `fwd 412.2 ms` as if a pass had just run."""
    from tokenviz.render.units import elapsed

    recording = frozen_recording(steps=4)
    app = recorded_app(recording)
    async with app.run_test(size=(200, 40)) as pilot:
        await wait_for(lambda: "recording" in status(app), pilot)
        line = status(app)
        assert line.startswith("recording · ")
        latest = recording[0].latest
        assert f"recorded fwd {elapsed(latest.forward_ms)}" in line and " fwd" not in line.replace("recorded fwd", "")
    app = make_app(SamplingSettings(temperature=0))
    async with app.run_test(size=(200, 40)) as pilot:
        await settle(app, pilot)
        assert "recording" not in status(app) and "recorded" not in status(app) and "fwd " in status(app)


async def test_a_step_far_slower_than_its_best_names_threads_once():
    """UX 7's finding 6: on a busy machine llama.cpp's two threads took 47-56 ms a step against 12-17 ms with
    `--threads 1`, and nothing said so. On a runtime whose threads are the user's (ModelInfo.threads), a step
    whose pass takes 3 times the fastest of the last ones says so once and names --threads; a runtime that
    takes no --threads says nothing."""
    import dataclasses

    for threads in (2, 0):
        app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            engine = app.journey.worker.session.engine
            engine.info = dataclasses.replace(engine.info, threads=threads)
            await pilot.press(*["space"] * 5)
            s = await settle(app, pilot)
            best = min(r.forward_ms for r in s.records[1:])
            forward, calls = engine.model.forward, []

            def slow_once(*args, forward=forward, calls=calls, best=best, **kwargs):  # (a busy machine, one step)
                calls.append(1)
                if len(calls) == 1:
                    time.sleep(max(10 * best, 200) / 1000)
                return forward(*args, **kwargs)

            engine.model.forward = slow_once
            await pilot.press("space", "space")
            await settle(app, pilot)
            said = [n for n in app._notifications if "--threads" in str(n.message)]
            assert len(said) == (1 if threads else 0), [str(n.message) for n in app._notifications]
            if threads:
                assert "the runtime's 2 threads wait for each other" in str(said[0].message)


async def test_at_80x24_a_long_loading_line_keeps_its_time_and_escape_and_cuts_at_a_phrase():
    """UX 7's finding 15, its first part: at 80x24 the loading line was cut mid-phrase ("…to safetensors once;",
    "about 1 s left (Escape"). The time so far comes first, what Escape does is kept whole, and the message
    between is cut where a phrase ends."""
    import threading

    from tokenviz.backends.transformers.runner import ModelRunner
    from tokenviz.contract.snapshot import CANCELS
    from tokenviz.ui.app import TokenvizApp
    from tokenviz.worker.engine_thread import EngineWorker

    message = (
        "converting the GGUF to safetensors once; a tensor at a time, so its memory stays small, and later "
        f"starts read the cache, about 1 s left {CANCELS}"
    )
    loading = threading.Event()

    def build(progress):
        progress(message, None)
        loading.wait(30)
        return ModelRunner(tiny_model())

    app = TokenvizApp(EngineWorker(build, SamplingSettings(), "The cat"))
    async with app.run_test(size=(80, 24)) as pilot:
        line = app.query_one(StatusLine)
        await wait_for(lambda: "converting" in str(line.render()), pilot)
        shown = str(line.render()).strip()
        loading.set()
        assert re.match(r"loading · \d+(\.\d+)? s · converting", shown) and shown.endswith(CANCELS), shown
        kept = shown.split(" · ", 2)[2].removesuffix(CANCELS).rstrip()
        assert kept.endswith("…") and message.startswith(kept[:-1]), shown
        assert message[len(kept) - 1 :].startswith(("; ", ", ", " (", ": ", " · ")), shown  # (a phrase's end)


async def test_a_slow_attention_pass_is_said_and_the_status_line_gives_the_steps_whole_time(monkeypatch):
    """UX 7's findings 7, 8 and 12: after ten ← on llama.cpp the map showed the old rows for 5-8 s with no note,
    and the status line's `fwd 173.8 ms` left out the attention and lens passes of a step that took 14 s. Ten
    cursor moves make one pass, said in the status line and the map's title while it lasts; once it is done the
    status line gives the whole time ('took'), and the timing view its parts."""
    from tokenviz.render.units import elapsed
    from tokenviz.ui.panes.attention import AttentionPane
    from tokenviz.worker import meanwhile

    monkeypatch.setattr(meanwhile, "SAID_AFTER_S", 0.3)
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=40))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press(*["space"] * 12)
        await settle(app, pilot)
        engine = app.journey.worker.session.engine
        attention, passes = engine.attention, []
        engine.attention = lambda *args: passes.append(1) or time.sleep(1.5) or attention(*args)
        await pilot.press(*["left"] * 10)
        pane = app.query_one(AttentionPane)
        await wait_for(lambda: "computing the attention map: layer" in status(app), pilot)
        await wait_for(lambda: "computing…" in str(pane.border_title), pilot)
        await wait_for(lambda: "computing" not in status(app), pilot, timeout=60)
        before = await settle(app, pilot)
        assert len(passes) <= 2 and "computing" not in str(pane.border_title), passes  # the first move's, the rest
        await pilot.press("space")
        await wait_for(lambda: len(app.journey.snapshot.records) == len(before.records) + 1, pilot)
        s = await settle(app, pilot)
        took = s.took
        assert took is not None and took.part("attention map") >= 1400, took
        assert f"took {elapsed(took.ms)}" in status(app), status(app)
        await pilot.press("i")
        await wait_for(lambda: "last step, whole" in body(app, "timing"), pilot)
        timing = body(app, "timing")
        assert f"last step, whole: {elapsed(took.ms)} = forward {elapsed(took.part('forward'))}" in timing, timing
        assert f"attention map {elapsed(took.part('attention map'))}" in timing, timing
