"""The why view (y) says what the diagnosis checked and what it cannot judge, and lists the steps where
the model was least sure, each a link that moves the cursor there (issue 69, finding 8)."""

from apptools import make_app, settle, wait_for

from tokenviz.contract.settings import SamplingSettings


async def test_the_least_sure_steps_are_listed_and_each_link_moves_the_cursor_there():
    app = make_app(SamplingSettings(temperature=0.9, seed=3, max_new_tokens=6))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot)
        await pilot.press("y")
        await wait_for(lambda: app.query_one("#views").current == "why", pilot)
        body = app.query_one("#why").body
        await wait_for(lambda: "highest entropy" in str(body.render()), pilot)
        shown = body.render()
        assert "Not judged: whether it is true" in str(shown)
        assert "move it with ← and →" in str(shown)  # (UX 7's 18: "click to go there" named no key)
        s = app.journey.snapshot
        taken = s.records[: len(s.chips) - s.prompt_len]
        least = min(taken, key=lambda r: r.decision.raw_prob)
        links = [span.style.meta["@click"] for span in shown.spans if getattr(span.style, "meta", None)]
        assert links[0] == f"screen.jump({least.position - 1})"
        await app.journey.run_action(f"jump({least.position - 1})")
        await wait_for(lambda: app.journey.current_selection().cursor == least.position - 1, pilot)
