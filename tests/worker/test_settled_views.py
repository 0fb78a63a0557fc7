"""UX 7's findings 7, 8 and 12: the standing views are computed once after every command queued, not once
after each (ten rewinds were ten attention passes on llama.cpp, 5-8 s, and a settings key waited behind
them); a wait past a second says what it waits on, how far and for how long; a step's whole time, its
views' passes in it, is what the frame says it took."""

import threading
import time

import pytest
from tiny import tiny_model
from worker.test_engine_worker import Collector

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.commands import Adjust, Intervene, Rewind, ShowAttention, Step
from tokenviz.contract.errors import Cancelled
from tokenviz.contract.interventions import Steering
from tokenviz.contract.settings import SamplingSettings
from tokenviz.worker import meanwhile
from tokenviz.worker.engine_thread import EngineWorker
from tokenviz.worker.meanwhile import Meanwhile

PROMPT = "The Eiffel Tower is located in the city of"


@pytest.fixture
def worker():
    made = EngineWorker(lambda progress: ModelRunner(tiny_model("llama")), SamplingSettings(seed=1), PROMPT)
    yield made
    made.stop()


def test_a_wait_says_nothing_before_a_second_then_what_how_far_and_how_long(monkeypatch):
    monkeypatch.setattr(meanwhile, "SAID_AFTER_S", 0.2)
    said: list[tuple[str, str]] = []
    with Meanwhile(lambda line, view: said.append((line, view))).saying("quick", " tokens"):
        pass
    assert said == []  # done before it was worth saying
    with Meanwhile(lambda line, view: said.append((line, view))).saying("feeding", " tokens", "lens") as progress:
        progress(128, 1000)
        time.sleep(0.5)
    assert len(said) >= 2 and all(view == "lens" for _, view in said), said
    assert said[0][0] == "feeding: 128 of 1,000 tokens · 1 s", said


def test_ten_rewinds_make_one_attention_pass_and_a_settings_key_runs_before_it(worker):
    post = Collector()
    worker.start(post)
    post.wait(lambda s: s.state == "ready")
    worker.submit(ShowAttention(layer=1, rows=8))
    for _ in range(12):
        worker.submit(Step())
    post.wait(lambda s: s.handled == 13 and s.attention is not None)
    engine = worker.session.engine
    passes, order, attention = [], [], engine.attention
    engine.attention = lambda *args: passes.append(args[1]) or order.append("pass") or attention(*args)
    set_settings = worker.session.set_settings
    worker.session.set_settings = lambda settings: order.append("settings") or set_settings(settings)
    gate = threading.Event()  # the thread holds its next command until all twelve are queued
    worker.submit(Adjust("temperature", 1))
    original_handle = worker._handle
    worker._handle = lambda command, autoplay: gate.wait(10) and original_handle(command, autoplay)
    for _ in range(10):
        worker.submit(Rewind(1))
    worker.submit(Adjust("temperature", 1))
    gate.set()
    s = post.wait(lambda s: s.handled == 25)
    assert order.count("settings") == 2 and order.count("pass") <= 1 and order[-1] in ("settings", "pass"), order
    assert s.attention is not None and s.attention.queries.stop == len(s.chips)  # the rows of the path now
    assert s.took is not None and s.took.part("attention map") is not None and s.took.ms >= s.took.part("attention map")


def test_a_step_took_its_forward_its_decision_and_its_views_passes(worker):
    post = Collector()
    worker.start(post)
    post.wait(lambda s: s.state == "ready")
    worker.submit(ShowAttention(layer=0, rows=6))
    worker.submit(Step())
    s = post.wait(lambda s: s.handled == 2 and s.took is not None)
    took, latest = s.took, s.records[-1]
    assert took.part("forward") == pytest.approx(latest.forward_ms, rel=1e-9)
    assert took.part("sampling") == pytest.approx(latest.decision.ms, rel=1e-9)
    named = sum(ms for name, ms in took.parts if name != "the rest")
    assert took.part("attention map") > 0 and took.ms == pytest.approx(named + (took.part("the rest") or 0), rel=1e-6)


def test_a_slow_attention_pass_says_so_and_the_frame_names_the_view(worker, monkeypatch):
    monkeypatch.setattr(meanwhile, "SAID_AFTER_S", 0.3)
    post = Collector()
    worker.start(post)
    post.wait(lambda s: s.state == "ready")
    engine = worker.session.engine
    attention = engine.attention
    engine.attention = lambda *args: time.sleep(1.2) or attention(*args)
    worker.submit(ShowAttention(layer=1, rows=8))
    done = post.wait(lambda s: s.handled == 1 and s.attention is not None, timeout=30)
    said = [s for s in post.snapshots if s.computing == "attention"]
    assert said and said[0].message.startswith("computing the attention map: layer 1, positions "), said
    assert said[0].seq < done.seq and done.computing == "" and done.message == ""


def test_steering_feeds_the_journey_again_saying_how_far(worker, monkeypatch):
    monkeypatch.setattr(meanwhile, "SAID_AFTER_S", 0.2)
    post = Collector()
    worker.start(post)
    ready = post.wait(lambda s: s.state == "ready")
    engine = worker.session.engine
    forward = engine.forward
    engine.forward = lambda *args, **kwargs: time.sleep(0.5) or forward(*args, **kwargs)
    worker.session.prefill_chunk = 4  # several chunks, so the line says how far
    worker.submit(Intervene(((Steering(1, 4.0, " Paris", " London"), True),)))
    done = post.wait(lambda s: s.handled == 1, timeout=60)
    said = [s.message for s in post.snapshots if "journey's tokens run again" in s.message]
    assert said and f" of {len(ready.chips)} tokens · " in said[-1], said
    assert done.error is None and done.took is not None and done.took.part("the model changed") > 1000


def test_a_settings_key_sets_a_long_attention_pass_aside_and_the_pass_runs_after(worker):
    """UX 7's finding 7, whole: a settings key is never queued behind a view's pass. A pass that can stop
    (llama.cpp's, between its graph's nodes) is set aside when a key waits; the key runs, then the pass
    again, and the frame after it has the rows."""
    post = Collector()
    worker.start(post)
    post.wait(lambda s: s.state == "ready")
    engine = worker.session.engine
    attention, order, started = engine.attention, [], threading.Event()

    def long_pass(ids, rows, layers, cancelled=None):  # a pass of up to 20 s that stops when asked
        order.append("pass")
        started.set()
        ends = time.monotonic() + 20
        while len([o for o in order if o == "pass"]) == 1 and time.monotonic() < ends:
            if cancelled is not None and cancelled():
                order.append("set aside")
                raise Cancelled("set aside")
            time.sleep(0.01)
        return attention(ids, rows, layers)

    engine.attention = long_pass
    set_settings = worker.session.set_settings
    worker.session.set_settings = lambda settings: order.append("settings") or set_settings(settings)
    worker.submit(ShowAttention(layer=1, rows=8))
    assert started.wait(20)
    worker.submit(Adjust("temperature", 1))
    s = post.wait(lambda s: s.handled == 2 and s.attention is not None, timeout=30)
    assert order == ["pass", "set aside", "settings", "pass"], order
    assert s.settings.temperature != SamplingSettings(seed=1).temperature
    assert s.attention.layer == 1 and not s.attention.failed


def test_a_wait_inside_another_is_the_outer_ones_to_say(monkeypatch):
    """The standing lens's request inside the views' settling: one line, the outer's, not two timers."""
    monkeypatch.setattr(meanwhile, "SAID_AFTER_S", 0.2)
    said: list[tuple[str, str]] = []
    telling = Meanwhile(lambda line, view: said.append((line, view)))
    with telling.saying("computing the logit lens at position 9", view="lens"), telling.saying("computing inner"):
        deadline = time.monotonic() + 30  # (the wait lasts until its timer has spoken, however busy the machine)
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
    assert said and all(line.startswith("computing the logit lens at position 9") for line, _ in said), said
    assert threading.active_count() == len([t for t in threading.enumerate() if t.name != "tokenviz-meanwhile"])
