"""The engine thread is guarded: a failure in a step, in building a snapshot or in handing it to the
UI becomes a one-line error in the next Snapshot, the thread lives on and the journey stays usable."""

import threading
import time

import pytest
from apptools import PROMPT, make_app, settle, wait_for
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Beams, Step
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.panes.beams import BeamPane
from tokenviz.worker import engine_thread
from tokenviz.worker.engine_thread import EngineWorker


class Collector:
    """A `post` that keeps every Snapshot; `fail_on` makes chosen calls raise instead."""

    def __init__(self, fail_on: tuple[int, ...] = ()):
        self.snapshots = []
        self.calls = 0
        self.fail_on = fail_on
        self.arrived = threading.Condition()

    def __call__(self, snapshot):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("the UI went away for a moment")
        with self.arrived:
            self.snapshots.append(snapshot)
            self.arrived.notify_all()

    def wait(self, predicate, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        with self.arrived:
            while True:
                if self.snapshots and predicate(self.snapshots[-1]):
                    return self.snapshots[-1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such snapshot; the last: {self.snapshots[-1:]}")
                self.arrived.wait(left)


@pytest.fixture
def started():
    workers = []

    def start(post):
        worker = EngineWorker(lambda progress: ModelRunner(tiny_model("llama")), SamplingSettings(seed=1), PROMPT)
        worker.start(post)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def test_a_failing_step_is_one_line_and_leaves_the_journey_as_it_was(started):
    post = Collector()
    worker = started(post)
    ready = post.wait(lambda s: s.state == "ready")
    runner = worker.session.engine
    forward = runner.forward
    runner.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom"))
    worker.submit(Step())
    failed = post.wait(lambda s: s.handled == 1)
    assert failed.error.startswith("internal error: boom (details in ") and "\n" not in failed.error
    assert failed.chips == ready.chips and failed.pending.decision == ready.pending.decision
    assert runner.kv_len == len(ready.chips)
    runner.forward = forward
    worker.submit(Step())
    after = post.wait(lambda s: s.handled == 2)
    assert after.error is None and after.chips[:-1] == ready.chips
    assert after.chips[-1].id == ready.pending.decision.chosen_id and worker._thread.is_alive()


def test_a_failure_while_building_a_snapshot_shows_the_last_frame_with_the_error(started, monkeypatch):
    post = Collector()
    worker = started(post)
    ready = post.wait(lambda s: s.state == "ready")
    real = engine_thread.snapshot_of
    failing = lambda *args, **kwargs: (_ for _ in ()).throw(ValueError("bad frame"))  # noqa: E731
    monkeypatch.setattr(engine_thread, "snapshot_of", failing)
    worker.submit(Step())
    failed = post.wait(lambda s: s.handled == 1)
    assert failed.error.startswith("internal error while drawing: bad frame")
    assert failed.chips == ready.chips  # the last good frame, not a blank one
    monkeypatch.setattr(engine_thread, "snapshot_of", real)
    worker.submit(Step())
    after = post.wait(lambda s: s.handled == 2)
    assert after.error is None and len(after.chips) == len(ready.chips) + 2  # both steps were taken


def scored(s) -> bool:
    """Ready, the prompt's predictions made (the engine makes them while idle after the prefill)."""
    return s.state == "ready" and bool(s.records) and len(s.records[0].prompt_predictions) >= s.prompt_len - 1


def test_a_failure_handing_a_snapshot_over_does_not_end_the_thread(started):
    post = Collector()
    worker = started(post)
    post.wait(scored)
    post.fail_on = (post.calls + 2,)  # "stepping", then the step's
    worker.submit(Step())
    shown = post.wait(lambda s: s.error is not None)
    assert "the UI went away" in shown.error
    worker.submit(Step())
    after = post.wait(lambda s: s.handled == 2 and s.error is None)
    assert len(after.chips) == after.prompt_len + 2 and worker._thread.is_alive()


async def test_the_app_shows_an_engine_failure_and_goes_on(monkeypatch):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        real = engine_thread.snapshot_of
        calls = []

        def failing_once(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise ValueError("bad frame")
            return real(*args, **kwargs)

        monkeypatch.setattr(engine_thread, "snapshot_of", failing_once)
        await pilot.press("space")
        await wait_for(lambda: any("bad frame" in n.message for n in app._notifications), pilot)
        await pilot.press("space")
        s = await settle(app, pilot)
        assert len(s.chips) == len(before.chips) + 2


def test_stopping_ends_a_long_run_at_its_next_forward_pass():
    from apptools import slowed

    from tokenviz.contract.commands import Beams

    post = Collector()
    worker = EngineWorker(
        lambda progress: ModelRunner(slowed(tiny_model("llama"), 0.05)), SamplingSettings(seed=1), PROMPT
    )
    worker.start(post)
    post.wait(lambda s: s.state == "ready")
    worker.submit(Beams(width=3, steps=100))  # about 5 s of forward passes
    time.sleep(0.2)
    started = time.monotonic()
    assert worker.stop(timeout=5.0)
    assert time.monotonic() - started < 2.5  # at the next forward pass, not after the search


async def test_escape_cancels_a_beam_search_and_the_journey_goes_on():
    app = make_app(step_seconds=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        app.journey.query_one(BeamPane).action_beams(3)
        await pilot.pause(0.2)
        await pilot.press("escape")
        s = await settle(app, pilot)
        assert any("beam search cancelled" in n.message for n in app._notifications)
        assert s.result(Beams) is None and s.chips == before.chips


def test_the_error_log_rotates(tmp_path, monkeypatch):
    from tokenviz.worker import errorlog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(errorlog, "MAX_LOG_BYTES", 2000)
    for _ in range(20):
        try:
            raise RuntimeError("x" * 200)
        except RuntimeError:
            line = errorlog.log_exception()
    log = tmp_path / "tokenviz" / "tokenviz.log"
    assert line == f"details in {log}"
    assert log.stat().st_size <= 2000 + 1000 and (tmp_path / "tokenviz" / "tokenviz.log.1").exists()


def test_the_first_prompt_is_tokenized_once():
    """Its tokens are on screen before its prefill ends, and the prefill takes those same ids: the engine
    was asked to tokenize the prompt twice."""
    encoded: list[str] = []

    def load(progress):
        runner = ModelRunner(tiny_model("llama"))
        encode = runner.encode

        def counted(text, special_tokens=True):
            encoded.append(text)
            return encode(text, special_tokens)

        runner.encode = counted
        return runner

    worker = EngineWorker(load, SamplingSettings(seed=1), PROMPT)
    post = Collector()
    worker.start(post)
    try:
        post.wait(lambda s: bool(s.records))
    finally:
        worker.stop()
    assert encoded.count(PROMPT) == 1, encoded
