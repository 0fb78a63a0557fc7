"""Helpers for driving the app in tests."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from tiny import tiny_model

from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.contract.snapshot import Snapshot
from tokenviz.files.journey_file import Recording
from tokenviz.journey.session import Session
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine_thread import EngineWorker
from tokenviz.worker.recording import RecordingWorker
from tokenviz.worker.snapshots import saved_attention_of, snapshot_of

PROMPT = "The Eiffel Tower is located in"


def slowed(loaded, seconds: float):
    """Make each forward pass take at least `seconds`, like a real model on a CPU."""
    forward = loaded.model.forward

    def slow_forward(*args, **kwargs):
        time.sleep(seconds)
        return forward(*args, **kwargs)

    loaded.model.forward = slow_forward
    return loaded


def make_app(
    settings: SamplingSettings | None = None,
    prompt: str = PROMPT,
    kind: str = "llama",
    context: int = 128,
    step_seconds: float = 0.0,
    lens_layers: str | None = None,
    **kwargs,
) -> TokenvizApp:
    from tokenviz.contract.lens_layers import parse_lens_layers

    worker = EngineWorker(
        lambda progress: ModelRunner(slowed(tiny_model(kind, context), step_seconds)),
        settings or SamplingSettings(),
        prompt,
        lens_layers=None if lens_layers is None else parse_lens_layers(lens_layers),
    )
    return TokenvizApp(worker, **kwargs)


def recorded_app(recording: Recording, theme: str = "tokenviz-dark") -> TokenvizApp:
    """The app on a recording: every pane works, nothing runs a model."""
    return TokenvizApp(RecordingWorker(*recording), theme=theme)


async def settle(app: TokenvizApp, pilot, timeout: float = 20.0) -> Snapshot:
    """Wait until every command sent so far is handled and its snapshot is on screen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.01)
        s = app.journey.snapshot
        if (
            s is not None
            and s.records
            and s.handled >= app.journey.worker.submitted
            and not s.playing
            and not app.journey._repaint_scheduled
            # the prompt's predictions, made while the engine is idle after its prefill (Session.score_prompt)
            and len(s.records[0].prompt_predictions) >= len(s.records[0].input_ids) - 1
        ):
            await pilot.pause()
            return s
    raise AssertionError(f"the engine did not settle: {app.journey.snapshot and app.journey.snapshot.state}")


def text_of(widget) -> str:
    """The plain text a pane shows now."""
    strips = [widget.render_line(y) for y in range(widget.size.height)] if hasattr(widget, "render_line") else []
    return "\n".join(strip.text for strip in strips)


def frozen_snapshot(steps: int = 3, settings: SamplingSettings | None = None, kind: str = "llama") -> Snapshot:
    """A deterministic snapshot from a tiny model, with the timings zeroed."""
    return frozen_recording(steps, settings, kind).snapshot


def frozen_recording(
    steps: int = 3,
    settings: SamplingSettings | None = None,
    kind: str = "llama",
    prompt: str = PROMPT,
    context: int = 128,
) -> Recording:
    """A deterministic journey from a tiny model, with the timings zeroed, and its attention rows."""
    session = Session(ModelRunner(tiny_model(kind, context)), settings or SamplingSettings(seed=1))
    session.start(prompt)
    for _ in range(steps):
        session.step()
    records = tuple(
        dataclasses.replace(r, forward_ms=0.0, decision=dataclasses.replace(r.decision, ms=0.0))
        for r in session.records
    )
    return Recording(dataclasses.replace(snapshot_of(session), records=records), saved_attention_of(session))


def burst(app: TokenvizApp, keys: list[str]) -> None:
    """Deliver `keys` as a terminal delivers buffered input: all at once, no wait between them."""
    from textual import events

    for key in keys:
        char = " " if key == "space" else (key if len(key) == 1 else None)
        event = events.Key(key, char)
        event.set_sender(app)
        app._driver.send_message(event)


# A state is waited for this long by default: generous, so a loaded machine (a fresh clone's run at load 7-19
# took 10 s for a notification that came in 4.7 s alone: UX 7's finding 26) fails no test that would pass.
WAIT_S = 60.0


async def wait_for(predicate, pilot, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.02)
    raise AssertionError("condition not met in time")


async def answer_dialog(app: TokenvizApp, pilot, key: str, dialog: type, line: str) -> None:
    """Press `key`, wait for the `dialog` it opens, type `line` and Enter."""
    await pilot.press(key)
    await wait_for(lambda: isinstance(app.screen, dialog), pilot)
    await pilot.press(*("space" if ch == " " else ch for ch in line), "enter")


__all__ = [
    "PROMPT",
    "answer_dialog",
    "asyncio",
    "frozen_recording",
    "frozen_snapshot",
    "make_app",
    "settle",
    "wait_for",
]


async def enter_prompt(app: TokenvizApp, pilot, text: str) -> None:
    """Open the prompt editor with e, write `text` and start it with ctrl+s (chat as the editor offers)."""
    from textual.widgets import TextArea

    from tokenviz.ui.screens import PromptScreen

    await pilot.press("e")
    await wait_for(lambda: isinstance(app.screen, PromptScreen), pilot)
    app.screen.query_one(TextArea).text = text
    await pilot.press("ctrl+s")


def model_rows(pane) -> list[str]:
    """The model view's rows, each whole: a wrapped row's later lines (indented to its value) joined to it."""
    rows: list[str] = []
    for line in str(pane.body.render()).splitlines():
        if rows and line[:1] == " ":
            rows[-1] += " " + line.strip()
        else:
            rows.append(line)
    return rows


def model_text(pane) -> str:
    """The model view's text, its rows whole, on one line."""
    return " ".join(model_rows(pane))
