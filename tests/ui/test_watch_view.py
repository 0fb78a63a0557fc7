"""Watching tokens in the app: w offers the candidates at the cursor or a typed token, W shows each
watched token over the steps and, for two, their logit difference split by layer; the lens gains a
column per watched token; a saved journey keeps it all and replay shows it."""

import pytest
from apptools import make_app, recorded_app, settle, wait_for

from tokenviz.contract.commands import Inspect, SplitDifference, Watch
from tokenviz.contract.settings import SamplingSettings
from tokenviz.render.visible import visible
from tokenviz.ui.screens import WatchScreen

SETTINGS = SamplingSettings(temperature=0, max_new_tokens=20)


def body(app, view: str) -> str:
    return str(app.query_one(f"#{view}").body.render())


async def test_w_watches_a_candidate_or_a_typed_token_and_w_shows_the_split():
    app = make_app(SETTINGS)
    async with app.run_test(size=(120, 40)) as pilot:
        s = await settle(app, pilot)
        second = s.pending.top[1]
        await pilot.press("w")
        await wait_for(lambda: isinstance(app.screen, WatchScreen), pilot)
        await pilot.press("tab", "down", "enter")  # the second candidate
        await wait_for(lambda: len(app.journey.snapshot.pinned) == 1, pilot)
        assert app.journey.snapshot.pinned[0][0] == second.id
        assert app.query_one("#views").current != "watch"  # w leaves the views as they are: W shows them
        assert any("W shows the watched tokens" in str(n.message) for n in app._notifications)
        await pilot.press("W")
        await wait_for(lambda: app.query_one("#views").current == "watch", pilot)
        await pilot.press("w")
        await wait_for(lambda: isinstance(app.screen, WatchScreen), pilot)
        await pilot.press(*"id:42", "enter")
        await wait_for(lambda: len(app.journey.snapshot.pinned) == 2, pilot)
        assert app.query_one("#views").current == "watch"  # the second w did not close it
        await pilot.press("space", "space", "space")
        await wait_for(lambda: app.journey.snapshot.result(SplitDifference) is not None, pilot)
        s = await settle(app, pilot)
        for record in s.records:  # every step follows both, those before the pin included
            assert [p.id for p in record.decision.pinned] == [second.id, 42]
        split = s.result(SplitDifference)
        assert split.position == app.journey.current_selection().cursor and (split.a_id, split.b_id) == (second.id, 42)
        shown = body(app, "watch")
        assert "raw" in shown and "final" in shown and f"{split.total:+.3f}" in shown and "layer 0" in shown
        await pilot.press("left")  # the split follows the cursor
        await wait_for(lambda: app.journey.snapshot.result(SplitDifference).position == split.position - 1, pilot)
        await pilot.press("l")  # the lens gains a column per watched token
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        await settle(app, pilot)
        lens = body(app, "lens")
        assert all(f"★{visible(piece)}" in lens for _, piece in app.journey.snapshot.pinned)
        assert len(app.journey.snapshot.result(Inspect).lens[0].pinned) == 2


async def test_a_token_of_several_pieces_is_refused_in_one_line():
    app = make_app(SETTINGS)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("w")
        await wait_for(lambda: isinstance(app.screen, WatchScreen), pilot)
        await pilot.press(*"The", "space", *"Eiffel", "enter")
        await wait_for(lambda: any("not one" in n.message for n in app._notifications), pilot)
        assert app.journey.snapshot.pinned == ()


async def test_the_watch_view_says_how_to_start_and_replay_shows_what_was_kept(tmp_path):
    from tokenviz.contract.commands import Save, Watch
    from tokenviz.files.journey_file import read_journey, recording_of

    app = make_app(SETTINGS)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("W")
        await settle(app, pilot)
        assert "press w" in body(app, "watch")
        app.journey.submit(Watch(7))
        app.journey.submit(Watch(42))
        await pilot.press("space", "space")
        await wait_for(lambda: app.journey.snapshot.result(SplitDifference) is not None, pilot)
        split = app.journey.snapshot.result(SplitDifference)
        app.journey.submit(Save(str(tmp_path / "j.json")))
        s = await settle(app, pilot)
    recording = recording_of(read_journey(tmp_path / "j.json"))
    assert recording.snapshot.pinned == s.pinned
    assert recording.snapshot.records == s.records  # the watched figures of every step, as computed
    assert split in recording.analyses.logit_differences
    replay = recorded_app(recording)
    async with replay.run_test(size=(120, 40)) as pilot:
        await settle(replay, pilot)
        await pilot.press("W")
        await wait_for(lambda: replay.journey.snapshot.result(SplitDifference) == split, pilot)
        await settle(replay, pilot)
        assert f"{split.total:+.3f}" in body(replay, "watch")
        await pilot.press("left", "left", "left", "left")  # before any split kept: the view says so, no error
        await settle(replay, pilot)
        assert replay.journey.snapshot.error is None and "needs the model" in body(replay, "watch")


async def test_at_80_columns_every_watched_tokens_rank_shows_and_one_scale_draws_them_all():
    from tokenviz.render.sparkline import SPARK

    app = make_app(SETTINGS)
    async with app.run_test(size=(80, 24)) as pilot:
        s = await settle(app, pilot)
        likely, unlikely = s.pending.top[0], s.pending.top[-1]
        for token in (likely.id, unlikely.id):
            app.journey.submit(Watch(token=token))
        await pilot.press("W")
        await wait_for(lambda: len(app.journey.snapshot.pinned) == 2, pilot)
        s = await settle(app, pilot)
        await pilot.pause(0.2)
        lines = body(app, "watch").splitlines()
        pinned = s.records[-1].decision.pinned
        for watched in pinned:
            assert any(f"rank {watched.rank} " in line for line in lines), (watched, lines)
        raw_lines = [line for line in lines if " raw " in line]
        assert len(raw_lines) == 2
        blocks = [SPARK.index(line.rstrip()[-1]) for line in raw_lines]  # the newest step of each
        assert blocks[0] > blocks[1]  # the likelier token stands higher: one scale for both


@pytest.mark.parametrize("size", [(80, 40), (200, 60)])
async def test_where_the_runtime_cannot_split_the_difference_its_reason_wraps_whole(size):
    """UX 7's finding 4: on llama.cpp the watch view's line saying why the logit difference is not split was cut
    at 80 and at 200 columns (the view's lines do not wrap); the reason wraps, whole, at either width."""
    import dataclasses

    from textual.geometry import Region

    from tokenviz.contract.engine import Capability, refusal_of

    app = make_app(SETTINGS)
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        engine = app.journey.worker.session.engine  # (as llama.cpp's: no logit split, and why)
        why = "llama.cpp computes a layer's attention and MLP in one graph and keeps no part of it apart"
        engine.info = dataclasses.replace(
            engine.info,
            capabilities=tuple(c for c in engine.info.capabilities if c != Capability.LOGIT_SPLIT.value),
            lacks_why=(*engine.info.lacks_why, (Capability.LOGIT_SPLIT.value, why)),
        )
        for typed in ("id:42", "id:43"):
            await pilot.press("w")
            await wait_for(lambda: isinstance(app.screen, WatchScreen), pilot)
            await pilot.press(*typed, "enter")
            await wait_for(lambda: not isinstance(app.screen, WatchScreen), pilot)
        await pilot.press("space")
        s = await settle(app, pilot)
        assert len(s.pinned) == 2
        await pilot.press("W")
        await wait_for(lambda: app.query_one("#views").current == "watch", pilot)
        reason = refusal_of(s.info, Capability.LOGIT_SPLIT, "the split of their logit difference by layer")
        pane = app.query_one("#watch").body

        def shown() -> str:
            lines = pane.render_lines(Region(0, 0, pane.size.width, pane.size.height))
            return " ".join(" ".join("".join(seg.text for seg in line).split()) for line in lines)

        await wait_for(lambda: "the split of their logit difference" in shown(), pilot)
        assert " ".join(reason.split()) in shown(), (size, shown())
