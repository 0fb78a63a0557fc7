"""The routing view (R): for a mixture-of-experts model, each MoE layer's experts for the token at the
cursor as its router chose them; a dense model says it has none. At 80x24 and at 200x60."""

import pytest
from apptools import settle, wait_for
from families import family_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine_thread import EngineWorker

PROMPT = "The cat sat on the mat. The dog"


def shown_in(pane) -> str:
    return str(pane.body.render())


def app_on(kind: str) -> TokenvizApp:
    worker = EngineWorker(lambda progress: ModelRunner(family_model(kind)), SamplingSettings(temperature=0), PROMPT)
    return TokenvizApp(worker)


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_the_routing_view_shows_the_routers_choice_at_the_cursor(size):
    from tokenviz.ui.panes.routing import routes_at

    app = app_on("mixtral")
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("s", "s")
        s = await settle(app, pilot)
        await pilot.press("R")
        await wait_for(lambda: app.query_one("#views").current == "routing", pilot)
        pane = app.query_one("#routing")
        await wait_for(lambda: "L0" in shown_in(pane), pilot)
        shown = shown_in(pane)
        cursor = app.journey.current_selection().cursor
        routes = routes_at(s, cursor)
        assert routes is not None and f"@{cursor}" in shown
        for route in routes:
            row = next(line for line in shown.splitlines() if line.startswith(f"L{route.layer} "))
            assert f"e{route.experts[0]}" in row and f"{route.weights[0]:4.2f}" in row
        assert "top expert per layer" in shown or size == (80, 24)  # (below the fold at 80x24: it scrolls)
        await pilot.press("R")
        await wait_for(lambda: app.query_one("#views").current != "routing", pilot)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
async def test_a_dense_model_says_it_has_no_routing_in_whole(size):
    app = app_on("llama")
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("R")
        pane = app.query_one("#routing")
        await wait_for(lambda: "no mixture-of-experts layers" in shown_in(pane), pilot)
        await pilot.pause()
        body = pane.body
        lines = body.render_lines(body.region.reset_offset)
        on_screen = " ".join(" ".join("".join(seg.text for seg in line).split()) for line in lines)
        assert "so there is no routing to show." in on_screen  # wrapped, not cut at "mixture-of-e"
        assert body.region.right <= pane.region.right
