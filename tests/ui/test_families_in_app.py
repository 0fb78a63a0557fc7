"""The app on families that differ most from the bundled model: hybrid sliding/global layers,
logit soft-capping, ALiBi, multi-query attention and a final norm inside the decoder. Every key
that runs the model works and every pane draws."""

import pytest
from apptools import settle, wait_for
from families import family_model

from tokenviz.contract.commands import Beams, Inspect, Speculate, Verify
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine import EngineWorker

PROMPT = "The cat sat on the mat. The cat sat on the"


@pytest.mark.parametrize("kind", ["gemma2", "opt", "bloom", "gpt_bigcode"])
async def test_every_view_works_on_the_family(kind):
    worker = EngineWorker(lambda progress: family_model(kind), SamplingSettings(seed=2), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(160, 48)) as pilot:
        start = await settle(app, pilot)
        await pilot.press(*["space"] * 8, "backspace", "backspace", "left", "left", "2")  # step past the window
        s = await settle(app, pilot)
        assert len(s.chips) == len(start.chips) + 5 and len(s.branches) == 2  # the 5th token replaced
        for key, view, ready in [
            ("l", "lens", lambda: app.journey.snapshot.result(Inspect) is not None),
            ("v", "cache", lambda: app.journey.snapshot.result(Verify) is not None),
            ("B", "beams", lambda: app.journey.snapshot.result(Beams) is not None),
            ("S", "speculation", lambda: app.journey.snapshot.result(Speculate) is not None),
        ]:
            await pilot.press(key)
            await wait_for(ready, pilot)
            await settle(app, pilot)
            assert app.query_one("#views").current == view
        assert app.journey.snapshot.result(Verify).max_logit_diff < 1e-4
        assert not [n for n in app._notifications if n.severity == "error"]


async def test_a_latent_cache_is_described_as_one():
    """DeepSeek V3's cache keeps one latent a position (multi-head latent attention): the model info
    and the KV cache view say so, not that its query heads share one key/value head."""
    worker = EngineWorker(lambda progress: family_model("deepseek_v3"), SamplingSettings(seed=2), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        for key, view, said in [
            ("M", "model", "4 query heads over one latent of 16 a position (multi-head latent attention)"),
            ("c", "cache", "multi-head latent attention: each layer expands the latent into its 4 heads"),
        ]:
            await pilot.press(key)
            await wait_for(lambda view=view: app.query_one("#views").current == view, pilot)
            await settle(app, pilot)
            text = str(app.query_one(f"#{view}").body.render())
            assert said in text and "sharing" not in text and "heads share" not in text
