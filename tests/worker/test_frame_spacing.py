"""Autoplay publishes no more frames than the app draws: a snapshot nobody draws still costs the
model its time. The last one always comes, and a set pace publishes every step."""

import time

from test_engine_worker import Collector, scored
from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Pace, Play
from tokenviz.contract.settings import SamplingSettings
from tokenviz.worker.engine_thread import EngineWorker

STEPS = 24


def autoplay(space_s: float | None, pace: int = 0) -> tuple[list, float]:
    post = Collector()
    settings = SamplingSettings(temperature=0, max_new_tokens=STEPS)
    worker = EngineWorker(lambda progress: ModelRunner(tiny_model("llama")), settings, "The Eiffel Tower is")
    worker.start(post)
    try:
        post.wait(scored)
        runner = worker.session.engine
        runner_step = runner.forward

        def slow_forward(*args, **kwargs):  # each step takes 20 ms, as on a slow machine
            time.sleep(0.02)
            return runner_step(*args, **kwargs)

        runner.forward = slow_forward
        if space_s is not None:
            worker.space_frames(space_s)
        for _ in range(pace):
            worker.submit(Pace(1))
        before = len(post.snapshots)
        started = time.perf_counter()
        worker.submit(Play(on=True))
        post.wait(lambda s: s.stop_reason is not None and not s.playing)
        return post.snapshots[before:], time.perf_counter() - started
    finally:
        worker.stop()


def test_autoplay_publishes_at_the_spacing_the_app_asks_for_and_always_the_last():
    default, _ = autoplay(None)
    spaced, seconds = autoplay(0.25)
    assert len(default) >= STEPS * 0.8  # steps slower than FRAME_S: each one published
    assert 2 <= len(spaced) <= seconds / 0.25 + 3
    assert spaced[-1].stop_reason is not None and len(spaced[-1].records) == STEPS


def test_a_set_pace_publishes_every_step_whatever_the_spacing():
    paced, _ = autoplay(0.25, pace=1)
    steps = [len(s.records) for s in paced if s.playing]
    assert paced[0].pace_s > 0 and steps == sorted(set(steps)) and len(steps) >= STEPS - 1
