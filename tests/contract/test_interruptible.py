"""A section of a thread that another thread may interrupt part way (a compile's warm-up), and nothing
raised anywhere else."""

import threading
import time

from tokenviz.system.interruptible import Interrupted, inside, interrupt, interruptible

WAIT_S = 30.0  # generous: a busy machine delays a thread's next instruction


def busy(seconds: float) -> int:
    """Python work with no point to ask between (as tracing a model is), for up to `seconds`."""
    ends, n = time.monotonic() + seconds, 0
    while time.monotonic() < ends:
        n += 1
    return n


def run_in_thread(work):
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work()
        except BaseException as exc:  # (what the thread saw)
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def wait_until(condition) -> None:
    ends = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < ends, "timed out"
        time.sleep(0.005)


def test_a_thread_inside_a_section_is_interrupted_there_once_and_goes_on_after_it():
    after: list[int] = []

    def work():
        try:
            with interruptible():
                busy(WAIT_S)
        except Interrupted:
            after.append(busy(0.2))  # (no stray exception lands once the section is left)
            return "interrupted"
        return "finished"

    thread, outcome = run_in_thread(work)
    wait_until(lambda: inside(thread))
    started = time.monotonic()
    assert interrupt(thread)
    assert not interrupt(thread)  # (once)
    thread.join(WAIT_S)
    assert outcome == {"value": "interrupted"} and after and after[0] > 0
    assert time.monotonic() - started < WAIT_S / 2
    assert not inside(thread)


def test_a_thread_outside_any_section_is_never_interrupted():
    def work():
        busy(0.3)
        return "finished"

    thread, outcome = run_in_thread(work)
    assert not interrupt(thread)
    thread.join(WAIT_S)
    assert outcome == {"value": "finished"}


def test_an_interrupt_that_comes_as_native_work_ends_is_raised_at_the_section_and_not_after():
    """A call into native code (a sleep here, a file compiled there) runs to its end; the interrupt
    lands at the next instruction, still the section's."""
    left: list[str] = []

    def work():
        try:
            with interruptible():
                time.sleep(0.5)
        except Interrupted:
            left.append("interrupted")
        busy(0.2)
        return "went on"

    thread, outcome = run_in_thread(work)
    wait_until(lambda: inside(thread))
    assert interrupt(thread)
    thread.join(WAIT_S)
    assert left == ["interrupted"] and outcome == {"value": "went on"}


def test_an_interrupt_lost_where_python_ignores_exceptions_is_sent_again(monkeypatch):
    """An Interrupted landing in a garbage collector's callback run by the section's thread is printed and
    dropped (seen in a full run: a render then ran past 300 s); the section is interrupted all the same."""
    from tokenviz.system import interruptible as module

    sent = []
    real = module._set_async

    def first_lost(thread_id, exc):
        sent.append(exc)
        if len(sent) > 1 or exc is None:
            real(thread_id, exc)

    monkeypatch.setattr(module, "_set_async", first_lost)

    finished = []

    def work():
        with interruptible():
            busy(WAIT_S)
            finished.append(True)  # (the work ran to its end: the interrupt was lost)

    thread, outcome = run_in_thread(work)
    wait_until(lambda: inside(thread))
    assert interrupt(thread)
    thread.join(2 * WAIT_S)
    assert isinstance(outcome.get("raised"), Interrupted) and not finished, outcome
    assert sent.count(Interrupted) >= 2  # (the first lost, another sent)
