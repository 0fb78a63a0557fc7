"""A step's open views come in its own frame: the lens view open on the newest position is a standing
request (ShowLens), so each step's frame carries its rows, during autoplay too, with no Inspect sent after
the frame and no second snapshot for it (the lens view showed nothing new while autoplay ran, and each
step cost a frame, an Inspect and a frame); and no frame is model work (the attention rows were computed
while a frame was built)."""

from __future__ import annotations

import dataclasses

from apptools import make_app, settle, wait_for
from fixed_backend import VOCAB, FixedModel

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


async def test_a_frame_is_built_without_the_model(monkeypatch):
    """The attention rows the pane shows are computed after the command that changed them, not while a
    frame is built (a frame was model work: a snapshot during a job's progress computed rows again)."""
    from tokenviz.journey.session import Session

    building: list[bool] = [False]
    during: list[bool] = []
    snapshot, attention = EngineWorker._snapshot, Session.attention

    def built(self, error):
        building[0] = True
        try:
            return snapshot(self, error)
        finally:
            building[0] = False

    def watched(self, queries, layers, cancelled=None):
        during.append(building[0])
        return attention(self, queries, layers, cancelled)

    monkeypatch.setattr(EngineWorker, "_snapshot", built)
    monkeypatch.setattr(Session, "attention", watched)
    app = make_app(SamplingSettings(temperature=0, max_new_tokens=STEPS))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(app, pilot)
        await pilot.press("space", "space", "left", "left")
        await settle(app, pilot)
        await wait_for(lambda: app.journey.snapshot.attention is not None, pilot)
        await pilot.press("a")
        await wait_for(lambda: app.journey.snapshot.stop_reason is not None, pilot, timeout=60)
        await settle(app, pilot)
    assert during and not any(during), during  # (rows computed, none of them while a frame was built)


class Counted(FixedModel):
    """The tests' stepping model, counting every token its tokenizer is asked to decode."""

    decoded = 0

    def decode(self, ids):
        Counted.decoded += len(ids)
        return super().decode(ids)


def test_a_snapshots_work_is_the_same_at_50_tokens_as_at_6000():
    """A snapshot after a step decodes what the step added, not the journey (its texts and chips kept
    between frames: journey.decoded_text, journey.chips): its work is flat in the journey's length, as
    bench's snapshot_growth measures its time."""
    from tokenviz.journey.session import Session
    from tokenviz.journey.stepped_engine import as_engine
    from tokenviz.worker.snapshots import snapshot_of

    work = {}
    for length in (50, 6000):
        session = Session(as_engine(Counted()), SamplingSettings(temperature=0, max_new_tokens=10**6))
        session.engine.info = dataclasses.replace(session.engine.info, context=8192)
        session.start([i % VOCAB for i in range(length)])
        snapshot_of(session)  # (the first frame makes the chips and texts whole)
        work[length] = []
        for _ in range(3):
            session.step()
            Counted.decoded = 0
            frame = snapshot_of(session)
            work[length].append(Counted.decoded)
        assert len(frame.chips) == length + 3 and frame.full_text.endswith(session.engine.decode(session.ids[-8:]))
    assert work[50] == work[6000] and max(work[6000]) < 50, work
