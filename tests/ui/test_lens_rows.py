"""The lens view computes the rows it has room for: as many as fit, spread over the model's depth, and
every layer's once the pane is tall enough (its cost follows the screen, not the model's depth)."""

from __future__ import annotations

from apptools import settle, wait_for
from test_app import pane_text
from tiny import tiny_model

from bench.anchors import LENS_VIEW_ROOM
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Inspect
from tokenviz.contract.lens_layers import spread
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.ui.panes.lens import LensPane
from tokenviz.worker.engine_thread import EngineWorker

LAYERS = 12  # (13 lens rows: more than a short pane shows)


def deep_app(asked: list) -> TokenvizApp:
    """The app on a tiny llama of LAYERS layers whose lens records the rows each computation is asked for."""

    def load(progress):
        runner = ModelRunner(tiny_model("llama", layers=LAYERS))
        inspect = runner.inspect

        def recorded(ask):
            asked.append(ask.rows)
            return inspect(ask)

        runner.inspect = recorded
        return runner

    return TokenvizApp(EngineWorker(load, SamplingSettings(temperature=0), "The Eiffel Tower is located in"))


def lens_rows(app) -> list[int]:
    found = app.journey.snapshot.result(Inspect)
    return [] if found is None else [row.layer for row in found.lens]


async def test_a_short_lens_view_computes_the_rows_it_shows_and_a_tall_one_every_layer():
    asked: list = []
    app = deep_app(asked)
    async with app.run_test(size=(110, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("l")
        room = app.journey.query_one(LensPane).rows_room()
        assert 2 <= room < LAYERS + 1, room  # (the test's premise: the pane is shorter than the model)
        assert room == LENS_VIEW_ROOM  # (what the bench measures as the view at 80x24 asks it)
        shown = spread(range(LAYERS + 1), room)
        await wait_for(lambda: lens_rows(app) == list(shown), pilot)
        assert asked == [shown]  # computed for those rows alone, once
        assert shown[0] == 0 and shown[-1] == LAYERS  # the embeddings and the model's own last row among them
        await wait_for(
            lambda: "top-1 from" in pane_text(app, "lens") or "never settles" in pane_text(app, "lens"), pilot
        )
        text = pane_text(app, "lens")
        assert (f"(of {len(shown)} shown)" in text) == ("top-1 from" in text)
        assert f"{len(shown)} of {LAYERS + 1} layers" in str(app.journey.query_one(LensPane).border_subtitle)
        await pilot.resize_terminal(110, 60)
        await wait_for(lambda: lens_rows(app) == list(range(LAYERS + 1)), pilot)
        assert asked[-1] is None  # every row: asked as the trace asks it
        await wait_for(lambda: " shown)" not in pane_text(app, "lens"), pilot)
        await pilot.resize_terminal(110, 24)  # shorter again: the rows it has are drawn, none computed
        await wait_for(lambda: " shown)" in pane_text(app, "lens") or "never settles" in pane_text(app, "lens"), pilot)
        await settle(app, pilot)  # (every command sent handled: a request for rows would have been)
        assert len(asked) == 2
