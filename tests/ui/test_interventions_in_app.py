"""Interventions in the app: z ablates the head in view (again restores it), I lists them and takes an
edit; while any is on, the status line says so and the next-token pane adds the model's own
probabilities and the KL from them."""

from apptools import answer_dialog, make_app, settle, wait_for

from tokenviz.contract.interventions import HeadAblation, Patch, Steering
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.next_token import NextTokenPane
from tokenviz.ui.panes.status import StatusLine
from tokenviz.ui.panes.timing import TimingPane
from tokenviz.ui.screens import InterventionsDialog


def pane_text(app) -> str:
    return str(app.query_one(NextTokenPane).content)


async def edit(app, pilot, line: str) -> None:
    await answer_dialog(app, pilot, "I", InterventionsDialog, line)


async def test_z_ablates_the_head_in_view_and_the_panes_show_both_distributions():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        before = await settle(app, pilot)
        await pilot.press("z")  # the map shows the heads' mean: no head to ablate
        await wait_for(lambda: any("choose one head" in str(n.message) for n in app._notifications), pilot)
        while not isinstance(app.journey.head, int):
            await pilot.press("h")
        await pilot.press("z")
        s = await settle(app, pilot)
        ablation = HeadAblation(app.journey.model_layer, app.journey.head)
        assert s.interventions == ((ablation, True),) and s.pending.interventions == (ablation,)
        assert s.pending.unsteered is not None and s.pending.unsteered.kl >= 0
        own, plain = s.pending.unsteered.top, before.pending.top  # the model's own: what it said before
        assert [c.id for c in own] == [c.id for c in plain]
        assert all(abs(a.prob - b.prob) < 1e-5 for a, b in zip(own, plain))
        assert "own p" in pane_text(app) and "from the model's own" in app.query_one(NextTokenPane).border_subtitle
        assert ablation.label in str(app.query_one(StatusLine).render())
        await pilot.press("space", "i")  # a step under it, and the timing view says what the own pass costs
        s = await settle(app, pilot)
        assert "interventions: + " in str(app.query_one(TimingPane).body.render()) and s.records[-2].unsteered.ms > 0
        await pilot.press("backspace", "z")  # back, and again z: restored
        s = await settle(app, pilot)
        assert s.interventions == () and s.pending.unsteered is None and "own p" not in pane_text(app)
        assert [c.id for c in s.pending.top] == [c.id for c in before.pending.top]


async def test_the_interventions_dialog_adds_turns_off_and_removes_and_refuses_a_mistake():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await edit(app, pilot, "steer-tokens 1:6:a:b")
        s = await settle(app, pilot)
        steering = Steering(1, 6.0, "a", "b", by="tokens")
        assert s.interventions == ((steering, True),) and s.pending.unsteered.kl > 0
        await edit(app, pilot, "1")
        s = await settle(app, pilot)
        assert s.interventions == ((steering, False),) and s.pending.unsteered is None
        await edit(app, pilot, "-1")
        s = await settle(app, pilot)
        assert s.interventions == ()
        await edit(app, pilot, "ablate 9.0")
        await wait_for(lambda: any("layers are 0-" in str(n.message) for n in app._notifications), pilot)
        await edit(app, pilot, "sharpen 1")
        await wait_for(lambda: any("type ablate" in str(n.message) for n in app._notifications), pilot)
        assert (await settle(app, pilot)).interventions == ()


async def test_y_and_j_begin_the_dialog_with_a_steering_or_a_patch():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        for key, rest, added in [
            ("Y", "1:2:cats:dogs", Steering(1, 2.0, "cats", "dogs")),
            ("J", "1:1:The dog", Patch(1, 1, "The dog")),
        ]:
            await answer_dialog(app, pilot, key, InterventionsDialog, rest)
            s = await settle(app, pilot)
            assert s.interventions[-1] == (added, True)
        assert s.pending.interventions == (Steering(1, 2.0, "cats", "dogs"), Patch(1, 1, "The dog"))


async def test_at_80x24_the_next_token_pane_keeps_the_kl_and_the_position():
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await edit(app, pilot, "steer-tokens 1:6:a:b")
        s = await settle(app, pilot)
        subtitle = str(app.query_one(NextTokenPane).border_subtitle)
        assert f"KL {s.pending.unsteered.kl:.3f}" in subtitle and f"pos {s.pending.position}" in subtitle
        assert "own p" in pane_text(app)


async def test_one_numbering_the_title_names_the_head_z_ablates_and_the_lens_rows_follow_it():
    """Layers and heads count from 0 everywhere: the attention title's "layer L of N · head H of M" is
    the head z ablates (ablate LL.HH, as --ablate L.H takes it); the lens's rows are emb, L0, L1, ..."""
    import re

    from tokenviz.ui.panes.attention import AttentionPane

    app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(app, pilot)
        await pilot.press("left_square_bracket", "h", "h")  # one layer down from the last; the first head
        await settle(app, pilot)
        title = str(app.query_one(AttentionPane).border_title)
        named = re.search(r"layer (\d+) of (\d+) · head (\d+) of (\d+)", title)
        assert named is not None, title
        layer, layers, head, _ = map(int, named.groups())
        assert (layer, head) == (app.journey.model_layer, app.journey.head) == (layers - 2, 0)
        await pilot.press("z")
        s = await settle(app, pilot)
        assert s.interventions[0][0].label == f"ablate L{layer}.H{head} (zero)"
        await pilot.press("l")
        await wait_for(lambda: "emb" in str(app.query_one("#lens").body.content), pilot)
        lens = str(app.query_one("#lens").body.content)
        rows = re.findall(r"^[ ★]\s*(emb|L\d+) ", lens, re.M)
        assert rows == ["emb", *(f"L{i}" for i in range(layers))], rows


async def test_the_status_line_names_every_intervention_where_they_fit():
    """UX 7's finding 23: with two interventions on, the status line said `ablate L1.H0 (zero) +1` at any width,
    hiding the second. Where they fit (the line's other figures giving way first), each is named whole."""
    steering = Steering(1, 6.0, "a", "b", by="tokens")
    for size in ((200, 60), (80, 24)):
        said = f"ablate L1.H0 (zero), {steering.label}"
        app = make_app(SamplingSettings(temperature=0, max_new_tokens=30))
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await edit(app, pilot, "ablate 1.0")
            await settle(app, pilot)
            await edit(app, pilot, "steer-tokens 1:6:a:b")
            s = await settle(app, pilot)
            assert [i for i, _ in s.interventions] == [HeadAblation(1, 0), steering]
            await wait_for(lambda app=app, said=said: said in str(app.query_one(StatusLine).render()), pilot)
