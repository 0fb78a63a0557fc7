"""The lens view open on the newest position is a standing request (ShowLens): each step's frame carries
its rows, during autoplay too, with no Inspect sent after the frame and no second snapshot for it (the
lens view showed nothing new while autoplay ran, and each step cost a frame, an Inspect and a frame)."""

from __future__ import annotations

from apptools import make_app, settle, wait_for

from tokenviz.contract.commands import Inspect, ShowLens
from tokenviz.contract.settings import SamplingSettings
from tokenviz.worker.engine_thread import EngineWorker

STEPS = 6


async def test_autoplay_with_the_lens_open_carries_each_steps_rows_in_its_own_frame(monkeypatch):
    built: list[tuple[int, int | None]] = []  # (tokens in the frame, the position of the lens it carries)
    snapshot = EngineWorker._snapshot

    def counted(self, error):
        frame = snapshot(self, error)
        found = frame.result(Inspect)
        built.append((len(frame.chips), None if found is None else found.position))
        return frame

    monkeypatch.setattr(EngineWorker, "_snapshot", counted)
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=STEPS), step_seconds=0.25)
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        sent: list = []
        submit = app.journey.worker.submit
        monkeypatch.setattr(app.journey.worker, "submit", lambda command: (sent.append(command), submit(command))[1])
        await pilot.press("l")
        await wait_for(lambda: app.journey.snapshot.result(Inspect) is not None, pilot)
        assert [type(c) for c in sent if isinstance(c, Inspect | ShowLens)] == [ShowLens]  # (no Inspect after it)
        start, before = len(app.journey.snapshot.chips), len(built)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot, timeout=60)
        await settle(app, pilot)
        assert not any(isinstance(c, Inspect) for c in sent), sent
        during = [(tokens, position) for tokens, position in built[before:] if tokens > start]
        fed = [(tokens, position) for tokens, position in during if tokens < start + STEPS]  # (the last is not fed)
        assert fed and all(position == tokens - 1 for tokens, position in fed), during  # (each its own step's rows)
        assert len(during) <= STEPS + 2, during  # (a frame a step at most: none built again for the lens)
        assert len(app.journey.snapshot.chips) == start + STEPS
