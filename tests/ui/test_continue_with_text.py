"""Continue with this text: f forces a typed text through the journey, one forced step a token,
recorded as usual with the model's own probability for each; any move takes over; u shades every
chip, generated ones included, by its surprisal."""

import torch
from apptools import answer_dialog, make_app, settle, wait_for
from stock import saved, stock_forward

from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.tokens import TokensPane
from tokenviz.ui.screens import ContinueScreen

TEXT = " is a tower of iron"


async def type_continuation(app, pilot, text: str) -> None:
    await answer_dialog(app, pilot, "f", ContinueScreen, text)


async def test_f_forces_each_token_of_the_text_with_the_models_own_probability():
    app = make_app(SamplingSettings(temperature=0.8, max_new_tokens=64))
    async with app.run_test(size=(120, 36)) as pilot:
        before = await settle(app, pilot)
        runner = app.journey.worker.session.engine
        expected = runner.encode(TEXT, special_tokens=False)
        await type_continuation(app, pilot, TEXT)
        await wait_for(lambda: len(app.journey.snapshot.records) == len(before.records) + len(expected), pilot)
        s = await settle(app, pilot)
        forced = s.records[len(before.records) - 1 : -1]  # the records that decided the text's tokens
        assert [r.decision.chosen_id for r in forced] == expected
        assert all(r.decision.mode == "forced" for r in forced) and not s.playing and s.message == ""
        ids = [c.id for c in s.chips]
        for r in forced:  # each probability is the model's own: a full forward without the cache
            logits = stock_forward(saved(runner.model), ids[: r.position]).logits[0, -1]
            raw = torch.softmax(logits.double(), -1)[r.decision.chosen_id]
            assert abs(float(raw) - r.decision.raw_prob) < 1e-5
        tokens = app.query_one(TokensPane)
        await pilot.press("u")
        await settle(app, pilot)
        generated = len(s.chips) - 1
        assert tokens._surprisal_shade(generated) is not None and tokens._surprisal_shade(0) is None


async def test_a_move_takes_over_from_a_continuation():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=64), step_seconds=0.15)
    async with app.run_test(size=(120, 36)) as pilot:
        before = await settle(app, pilot)
        await type_continuation(app, pilot, TEXT * 3)
        await wait_for(lambda: len(app.journey.snapshot.records) >= len(before.records) + 2, pilot)
        await pilot.press("backspace")
        s = await settle(app, pilot)
        await pilot.pause(0.5)
        assert app.journey.snapshot.records == s.records and not s.playing  # nothing more was forced
        assert "continuing" not in s.message
        assert not app.journey.worker._continuation.active and app.journey.worker._continuation.through
