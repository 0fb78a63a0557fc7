"""A long prefill in the app: its progress shows at once, Escape cancels it and the journey stays."""

from apptools import enter_prompt, make_app, settle, wait_for
from textual.widgets import ProgressBar

from tokenviz.journey import memory_policy
from tokenviz.ui.panes.status import StatusLine

LONG = "The cat sat on the mat. The dog sat on the log. " * 3


async def test_a_long_prefill_shows_progress_and_escape_cancels_it(monkeypatch):
    monkeypatch.setattr(memory_policy, "PROMPT_CHUNK", 2)
    app = make_app(step_seconds=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("space")
        before = await settle(app, pilot)
        await enter_prompt(app, pilot, LONG)
        await wait_for(
            lambda: app.journey.snapshot.state == "prefilling" and app.journey.snapshot.progress > 0.1, pilot
        )
        await pilot.pause(0.05)
        assert "prefilling:" in str(app.query_one(StatusLine).render())
        assert not app.query_one("#loading", ProgressBar).has_class("-hidden")
        await pilot.press("escape")
        s = await settle(app, pilot)
        assert s.chips == before.chips and s.pending.decision == before.pending.decision  # nothing lost
        assert any("prefill cancelled" in n.message for n in app._notifications)
        assert app.query_one("#loading", ProgressBar).has_class("-hidden")
        await pilot.press("space")  # the journey goes on from where it was
        after = await settle(app, pilot)
        assert after.chips[:-1] == before.chips


async def test_the_first_prompts_tokens_show_while_it_is_prefilled(monkeypatch):
    """The tokens are known before the prefill ends: the tokens pane shows them at once, not after."""
    from tokenviz.ui.panes.tokens import TokensPane

    monkeypatch.setattr(memory_policy, "PROMPT_CHUNK", 2)
    app = make_app(prompt=LONG, step_seconds=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(
            lambda: (
                app.journey.snapshot is not None
                and app.journey.snapshot.state == "prefilling"
                and 0.1 < (app.journey.snapshot.progress or 0) < 0.9
            ),
            pilot,
        )
        s = app.journey.snapshot
        assert not s.records and s.chips and s.prompt_len == len(s.chips)  # mid-prefill, every token there
        await pilot.pause(0.05)
        assert "The" in str(app.query_one(TokensPane).render())
        done = await settle(app, pilot)
        assert [c.id for c in done.chips[: s.prompt_len]] == [c.id for c in s.chips]
        assert done.chips[: s.prompt_len] == s.chips  # the same chips, before and after
