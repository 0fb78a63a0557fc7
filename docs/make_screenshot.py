"""Export the README's screenshots of the app (run from the repo root; name files to make only those):
docs/tokenviz.svg at 160x48, docs/tokenviz-120x36.svg (a teacher's projector) and
docs/tokenviz-80x24.svg (a student's terminal, a chat question) on the bundled model;
docs/tokenviz-routing.svg, the routing view on a tiny random Qwen2-MoE (tests/families.py);
docs/tokenviz-grammar.svg, a JSON-schema journey (docs/person.schema.json) on the bundled model."""

import asyncio
import sys
import time
from pathlib import Path

from tokenviz.backends.transformers.model_loader import model_loader
from tokenviz.backends.transformers.runner import ModelRunner
from tokenviz.contract.settings import SamplingSettings
from tokenviz.files.grammar_file import read_grammar
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine_thread import EngineWorker

DOCS = Path(__file__).parent


def tiny_qwen_moe(progress):
    sys.path.insert(0, str(DOCS.parent / "tests"))
    from families import family_model

    return family_model("qwen2_moe")


SHOTS = [  # (file, size, prompt, chat, keys, settings, model: None for the bundled one)
    (
        "tokenviz.svg",
        (160, 48),
        "The Eiffel Tower is located in",
        False,
        ["space"] * 6 + ["left_square_bracket"] * 4,
        SamplingSettings(seed=1),
        None,
    ),
    (
        "tokenviz-120x36.svg",
        (120, 36),
        "The Eiffel Tower is located in",
        False,
        ["space"] * 6,
        SamplingSettings(seed=1),
        None,
    ),
    (
        "tokenviz-80x24.svg",
        (80, 24),
        "What is the capital of France?",
        True,
        ["space"] * 6,
        SamplingSettings(seed=3),
        None,
    ),
    (
        "tokenviz-routing.svg",
        (120, 36),
        "The cat sat on the mat. The dog sat on the",
        False,
        ["space"] * 6 + ["R"],
        SamplingSettings(seed=1),
        tiny_qwen_moe,
    ),
    (
        "tokenviz-grammar.svg",
        (120, 36),
        "A person, as JSON:",
        False,
        ["space"] * 15,
        SamplingSettings(temperature=0, grammar=read_grammar("json-schema", str(DOCS / "person.schema.json"))),
        None,
    ),
]


async def shoot(
    name: str, size: tuple[int, int], prompt: str, chat: bool, keys: list[str], settings: SamplingSettings, model
) -> None:
    load = model or model_loader(None, device="cpu")
    worker = EngineWorker(lambda progress: ModelRunner(load(progress)), settings, prompt, chat=chat)
    app = TokenvizApp(worker)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 120
        while not (app.journey.snapshot and app.journey.snapshot.records) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.3)
        await pilot.pause(1.0)  # the attention rows for the last step
        app.save_screenshot(name, path=str(DOCS))
    print(f"wrote {DOCS / name}", file=sys.stderr)


async def main() -> None:
    for shot in SHOTS:
        if len(sys.argv) < 2 or shot[0] in sys.argv[1:]:
            await shoot(*shot)


asyncio.run(main())
