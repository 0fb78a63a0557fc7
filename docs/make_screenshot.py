"""Export docs/tokenviz.svg: the app on the bundled model after a few steps (run from the repo root)."""

import asyncio
import sys
import time
from pathlib import Path

from tokenviz.contract.settings import SamplingSettings
from tokenviz.ui.app import TokenvizApp
from tokenviz.worker.engine import EngineWorker
from tokenviz.worker.loader import model_loader

OUT = Path(__file__).parent / "tokenviz.svg"


async def main() -> None:
    worker = EngineWorker(model_loader(None, device="cpu"), SamplingSettings(seed=1), "The Eiffel Tower is located in")
    app = TokenvizApp(worker)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 120
        while not (app.snapshot and app.snapshot.records) and time.monotonic() < deadline:
            await pilot.pause(0.1)
        for key in ["space"] * 6 + ["left_square_bracket"] * 4:
            await pilot.press(key)
            await pilot.pause(0.3)
        await pilot.pause(0.5)
        app.save_screenshot(str(OUT.name), path=str(OUT.parent))
    print(f"wrote {OUT}", file=sys.stderr)


asyncio.run(main())
