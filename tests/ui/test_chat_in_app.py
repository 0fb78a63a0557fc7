"""Chat mode in the app: a user message through the model's chat template, offered first in the
prompt editor for a model that has one; the template's tokens are marked; r keeps the prefill."""

from apptools import settle, wait_for
from textual.widgets import Checkbox, TextArea
from tiny import tiny_chat_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.ui.screens import PromptScreen
from tokenviz.worker.engine_thread import EngineWorker

QUESTION = "What is the capital of France?"


def template_ids(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])


async def test_chat_from_the_command_line_then_from_the_editor_then_plain_text():
    loaded = tiny_chat_model()
    worker = EngineWorker(lambda progress: ModelRunner(loaded), SamplingSettings(seed=2), QUESTION, chat=True)
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 40)) as pilot:
        s = await settle(app, pilot)
        assert s.chat and s.prompt == QUESTION and s.info.chat_template
        assert [c.id for c in s.chips] == template_ids(loaded.tokenizer, QUESTION)
        words = "".join(c.text for c in s.chips if not c.is_template)
        assert words.strip() == QUESTION and s.chips[0].is_template

        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        assert app.screen.query_one(Checkbox).value  # chat is offered first
        app.screen.query_one(TextArea).text = "Hello there,\nhow are you?"  # several lines
        await pilot.press("ctrl+s")
        s = await settle(app, pilot)
        assert s.chat and s.prompt == "Hello there,\nhow are you?"
        assert [c.id for c in s.chips] == template_ids(loaded.tokenizer, "Hello there,\nhow are you?")

        await pilot.press("e")
        await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
        app.screen.query_one(Checkbox).value = False
        app.screen.query_one(TextArea).text = "The cat sat"
        await pilot.press("ctrl+s")
        s = await settle(app, pilot)
        assert not s.chat and not any(c.is_template for c in s.chips)
        assert "".join(c.text for c in s.chips) == "The cat sat"

        await pilot.press("e")  # the editor opens in the journey's mode: plain text now
        await wait_for(lambda: isinstance(app.screen, PromptScreen) and app.screen.query(TextArea), pilot)
        assert not app.screen.query_one(Checkbox).value
        await pilot.press("ctrl+a", *"A dog")  # select all, then typing replaces the old prompt
        assert app.screen.query_one(TextArea).text == "A dog"
        await pilot.press("ctrl+l")
        assert app.screen.query_one(TextArea).text == ""
        await pilot.press(*"The dog ran", "ctrl+s")
        s = await settle(app, pilot)
        assert not s.chat and "".join(c.text for c in s.chips) == "The dog ran"


async def test_r_goes_back_to_the_prompt_without_prefilling_it_again():
    loaded = tiny_chat_model()
    fed = []
    forward = loaded.model.forward

    def counted(*args, **kwargs):
        fed.append(kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1])
        return forward(*args, **kwargs)

    worker = EngineWorker(lambda progress: ModelRunner(loaded), SamplingSettings(seed=2), QUESTION, chat=True)
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 40)) as pilot:
        first = await settle(app, pilot)
        await pilot.press("space", "space", "space")
        await settle(app, pilot)
        loaded.model.forward = counted
        await pilot.press("r")
        s = await settle(app, pilot)
        loaded.model.forward = forward
        assert s.chips == first.chips and s.pending.decision == first.pending.decision
        assert fed == []  # the prefill was kept
        assert len(s.branches) == 2  # the path left is kept


NESTED = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


async def test_a_template_that_runs_on_is_stopped_by_escape_and_the_journey_kept(monkeypatch):
    """Nested range(99999) loops in a template held the editor's prompt at "prefilling" forever, and
    Escape could not cancel it: Escape stops it now, the journey as it was; left alone, its deadline does."""
    from tokenviz.backends.shared import chat_template
    from tokenviz.contract.commands import Start
    from tokenviz.system.interruptible import inside

    monkeypatch.setattr(chat_template, "RENDER_S", 120.0)  # (only Escape ends the first render, however busy)

    loaded = tiny_chat_model()
    worker = EngineWorker(lambda progress: ModelRunner(loaded), SamplingSettings(seed=2), QUESTION, chat=True)
    app = TokenvizApp(worker)
    async with app.run_test(size=(120, 40)) as pilot:
        before = await settle(app, pilot)
        loaded.tokenizer.chat_template = NESTED
        worker.submit(Start("Hello", chat=True))
        await wait_for(lambda: inside(worker._thread), pilot)  # (rendering: the deadline is seconds away)
        await pilot.press("escape")
        await wait_for(lambda: "was cancelled" in (app.journey.snapshot.notice or ""), pilot, timeout=60)
        assert app.journey.snapshot.chips == before.chips and app.journey.snapshot.state == "ready"

        monkeypatch.setattr(chat_template, "RENDER_S", 1.0)  # (left alone, the deadline ends the next)
        worker.submit(Start("Hello", chat=True))
        await wait_for(lambda: "did not finish in 1 s" in (app.journey.snapshot.error or ""), pilot, timeout=60)
        assert app.journey.snapshot.chips == before.chips
