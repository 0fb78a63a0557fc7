"""A chat template is the model's own code (a GGUF's, a tokenizer's): whatever it does, it renders in
bounded time and memory, and what fails is one line naming the template, in both backends; Escape
cancels it."""

import threading
import time

import pytest
from tiny import tiny_chat_model

from tokenviz.backends.shared.chat_template import RENDER_S, render_chat_template
from tokenviz.backends.transformers.chat import chat_ids
from tokenviz.contract.errors import Cancelled, TokenvizError
from tokenviz.system.interruptible import interrupt

MESSAGES = [{"role": "user", "content": "hi"}]
NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "range(10**9)": ("{{ range(10**9) }}", "Range too big"),
    "1/0": ("{{ 1/0 }}", "division by zero"),
    "a recursive macro": ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "maximum recursion depth"),
    "'x' * 2000000000": ("{{ 'x' * 2000000000 }}", "makes a value of over 1,048,576 items with *"),
    "10 ** 10**8": ("{{ 10 ** 100000000 }}", "makes a value of over 1,048,576 items with **"),
    "a list * 10**9": ("{{ [1, 2] * 1000000000 }}", "makes a value of over 1,048,576 items with *"),
    "nested range(99999) loops": (NESTED, f"did not finish in {RENDER_S:g} s"),
    "megabytes written": ("{% for i in range(99999) %}{{ 'x' * 64 }}{% endfor %}", "writes over 1,048,576 characters"),
    "raise_exception": ("{{ raise_exception('This model takes no system message') }}", "takes no system message"),
    "a block never closed": ("{% for m in messages %}{{ m.content }}", "failed"),
    "Python's insides": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "a TypeError inside": ("{{ messages[0].content + 1 }}", "failed"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_is_one_line_within_its_bounds(name):
    from tokenviz.backends.shared.chat_template import _environment

    template, said = HOSTILE[name]
    _environment()  # (transformers' part imported: what is timed is the template's render)
    started = time.monotonic()
    with pytest.raises(TokenvizError) as caught:
        render_chat_template(template, MESSAGES, bos_token="<s>", eos_token="</s>")
    message = str(caught.value)
    assert said in message and message.startswith("the chat template") and "\n" not in message, message
    assert time.monotonic() - started < RENDER_S + 30  # (bounded: the deadline, and a busy machine's margin)


def test_a_template_renders_as_transformers_renders_it():
    from transformers.utils.chat_template_utils import render_jinja_template

    template = tiny_chat_model().tokenizer.chat_template
    messages = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    ours = render_chat_template(template, messages, bos_token="<s>", eos_token="</s>")
    theirs = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )[0][0]
    assert ours == theirs and "Be brief." in ours


@pytest.mark.parametrize("name", ["'x' * 2000000000", "nested range(99999) loops", "1/0"])
def test_the_transformers_backend_bounds_a_tokenizers_template_too(name):
    tokenizer = tiny_chat_model().tokenizer
    tokenizer.chat_template = HOSTILE[name][0]
    with pytest.raises(TokenvizError, match=r"^the chat template"):
        chat_ids(tokenizer, "hi")


def test_escape_cancels_a_template_that_runs_on(monkeypatch):
    """The worker's cancel interrupts the thread inside a render (WorkerThread.cancel): Cancelled, not the
    deadline's line (set far off here, so that only the interrupt can end it on a busy machine)."""
    from tokenviz.backends.shared import chat_template
    from tokenviz.system.interruptible import inside

    monkeypatch.setattr(chat_template, "RENDER_S", 120.0)
    outcome: list[BaseException] = []

    def render() -> None:
        try:
            render_chat_template(NESTED, MESSAGES)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=render)
    thread.start()
    deadline = time.monotonic() + 60
    while not inside(thread) and time.monotonic() < deadline:  # (the render's section begun)
        time.sleep(0.01)
    assert interrupt(thread)
    thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome


def test_an_escape_as_the_render_begins_is_never_lost(monkeypatch):
    """Escape sent the moment the render's section began landed, 5 times in 200, in the deadline's timer thread
    as it was being started (CPython gives a thread being started its starter's id), and the render ran on."""
    from tokenviz.backends.shared import chat_template
    from tokenviz.system.interruptible import inside

    monkeypatch.setattr(chat_template, "RENDER_S", 120.0)
    chat_template._environment()

    def render(outcome: list[BaseException]) -> None:
        try:
            render_chat_template(NESTED, MESSAGES)
        except BaseException as exc:
            outcome.append(exc)

    for _ in range(200):
        outcome: list[BaseException] = []
        thread = threading.Thread(target=render, args=(outcome,))
        thread.start()
        deadline = time.monotonic() + 60
        while not inside(thread) and time.monotonic() < deadline:  # (at once: the race is with its first steps)
            pass
        assert interrupt(thread)
        thread.join(300)  # (generous: a loaded machine starves the thread, seen at 60 s)
        assert len(outcome) == 1 and isinstance(outcome[0], Cancelled), outcome
