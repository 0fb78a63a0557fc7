"""The app on families that differ most from the bundled model: hybrid sliding/global layers,
logit soft-capping, ALiBi, multi-query attention and a final norm inside the decoder. Every key
that runs the model works and every pane draws."""

import pytest
from apptools import settle, wait_for
from families import family_model, gemma4_config, model_of

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Beams, Inspect, Speculate, Verify
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine_thread import EngineWorker

PROMPT = "The cat sat on the mat. The cat sat on the"

pytestmark = pytest.mark.families


@pytest.mark.parametrize("kind", ["gemma2", "opt", "bloom", "gpt_bigcode"])
async def test_every_view_works_on_the_family(kind):
    worker = EngineWorker(lambda progress: ModelRunner(family_model(kind)), SamplingSettings(seed=2), PROMPT)
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


@pytest.mark.parametrize(
    "kind, described",
    [
        (  # DeepSeek V3: one latent a position (multi-head latent attention)
            "deepseek_v3",
            [
                (
                    "M",
                    "model",
                    "4 query heads over one latent of 16 a position (multi-head latent attention)",
                    "sharing",
                ),
                (
                    "c",
                    "cache",
                    "multi-head latent attention: each layer expands the latent into its 4 heads",
                    "heads share",
                ),
            ],
        ),
        (  # Gemma 4: global layers with larger heads than the sliding ones
            "gemma4_text",
            [
                (
                    "c",
                    "cache",
                    "its layers differ: the first keeps keys + values × 2 KV heads × 8 dims a token",
                    "the same",
                )
            ],
        ),
    ],
)
async def test_an_unusual_cache_is_described_as_it_is(kind, described):
    """The model info and the KV cache view say what the cache holds, not arithmetic that does not add up."""
    model = (lambda: model_of(gemma4_config(), "tiny-gemma4")) if kind == "gemma4_text" else lambda: family_model(kind)
    worker = EngineWorker(lambda progress: ModelRunner(model()), SamplingSettings(seed=2), PROMPT)
    app = TokenvizApp(worker)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        for key, view, said, unsaid in described:
            await pilot.press(key)
            await wait_for(lambda view=view: app.query_one("#views").current == view, pilot)
            await settle(app, pilot)
            text = str(app.query_one(f"#{view}").body.render())
            assert said in text and unsaid not in text
